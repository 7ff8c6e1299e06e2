"""The parts of TrainLoop (aitoolbox_like/train_loop.py), one idea each: training.py (a fit in this process: the
epochs and their batches), step.py (one training step and the optimizer update), evaluation.py (losses and
predictions over a loader, the end-of-epoch evaluation) and checks.py (what fit checks before it trains). TrainLoop
declares the run state they share in its __init__."""
