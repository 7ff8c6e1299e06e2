"""make pta-check: pytorch-accelerated's own callback classes, from the installed package (verified equal to the
published wheel), run on the TrainLoop side by side with PTA's own Trainer and against the expectations of PTA's own
tests (see __main__.py)."""
