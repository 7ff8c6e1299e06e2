"""The public path of the loop's callbacks handler (``loop.callbacks_handler``), defined with the loop in
aitoolbox_like/engine/handler.py."""
from ..engine.handler import CallbacksHandler, CollectiveInRankRestrictedCallbackError  # noqa: F401  (public path)
