"""The public path of the loop's state as one checkpoint dict, and resuming from it: the names of
:mod:`aitoolbox_like.engine.loop_state`, where the loop keeps them beside itself."""
from ..engine.loop_state import *  # noqa: F401,F403
from ..engine.loop_state import __all__  # noqa: F401
