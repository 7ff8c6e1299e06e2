"""Learning-rate schedule callbacks."""


class AbstractScheduler:
    """Mixin of every scheduler callback; ``self.scheduler`` is the wrapped torch scheduler."""

    def __init__(self):
        self.scheduler = None

    def state_dict(self):
        return self.scheduler.state_dict() if self.scheduler is not None else None

    def load_state_dict(self, state_dict):
        self.scheduler.load_state_dict(state_dict)
