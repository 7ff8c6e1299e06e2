"""General-purpose callbacks."""
import logging

from .abstract import AbstractCallback

logger = logging.getLogger(__name__)


class ProgressBar(AbstractCallback):
    """A tqdm bar per epoch, with the epoch's metrics in the postfix at the end of the epoch.

    The TrainLoop adds one on the main process when its ``progress_bar`` is on (default: when stderr is
    a terminal). The running loss is shown every ``loss_refresh_steps`` steps; reading it is a host
    sync, so it is never done per step (0 disables it).
    """

    def __init__(self, loss_refresh_steps=50, leave=True):
        super().__init__('Progress bar', execution_order=97, device_idx_execution=0)
        self.loss_refresh_steps = loss_refresh_steps
        self.leave = leave
        self._bar = None

    def on_epoch_begin(self):
        from tqdm.auto import tqdm
        loop = self.train_loop_obj
        try:
            total = len(loop.train_loader)
        except TypeError:
            total = None
        total_epochs = f'/{loop.num_epochs}' if loop.num_epochs else ''
        self._bar = tqdm(total=total, desc=f'Epoch {loop.epoch + 1}{total_epochs}', leave=self.leave,
                         dynamic_ncols=True)

    def on_batch_end(self):
        self._bar.update(1)
        n = self.loss_refresh_steps
        if n and self._bar.n % n == 0 and self.train_loop_obj.loss_batch_accum:
            last = self.train_loop_obj.loss_batch_accum[-1]
            self._bar.set_postfix(loss=f'{float(last.total() if hasattr(last, "total") else last):.4g}',
                                  refresh=False)

    def on_epoch_end(self):
        history = self.train_loop_obj.train_history
        epoch = self.train_loop_obj.epoch
        postfix = {name: f'{values[-1]:.4g}' for name, values in history.items()
                   if values and isinstance(values[-1], float) and history.get_epochs(name)[-1] == epoch}
        self._bar.set_postfix(postfix)
        self._close()

    def on_exception(self, exception):
        self._close()

    def _close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
