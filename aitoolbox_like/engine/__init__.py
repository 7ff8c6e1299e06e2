"""The core: TrainLoop (train_loop.py) and what it is built on, the callback base and its hooks (callback.py), the
handler that registers callbacks and fires hooks (handler.py), and what fit checks and how a failed step is
explained (checks.py). Nothing here imports the callback library (aitoolbox_like/callbacks/): the default callbacks
are named by path and imported when a fit starts (docs/architecture.md)."""
