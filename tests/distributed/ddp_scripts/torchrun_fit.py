"""Started by tests/distributed/test_ddp.py with `python -m torch.distributed.run --nproc_per_node=2 torchrun_fit.py OUT_DIR`."""
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch                                          # noqa: E402
import torch.distributed as dist                     # noqa: E402
from torch import nn                                 # noqa: E402

from aitoolbox_like import AbstractCallback, TrainLoop  # noqa: E402
from ddp_common import SaveFinalWeights, equivalence_setup  # noqa: E402


class SayFromEveryRank(AbstractCallback):
    """What the library says in every process: an INFO message comes once, a warning with its rank (rank 0's
    without one)."""

    def __init__(self):
        super().__init__('say from every rank')

    def on_train_end(self):
        library = logging.getLogger('aitoolbox_like.tests')
        library.info('said by every rank')
        library.warning('warned by every rank')


def main(out_dir):
    model, train, val, optimizer = equivalence_setup()
    loop = TrainLoop(model, train, val, None, optimizer, nn.MSELoss(), gpu_mode='ddp')
    trained = loop.fit(num_epochs=2, grad_accumulation=2, callbacks=[SaveFinalWeights(out_dir), SayFromEveryRank()], on_gpu=False)
    assert trained is model
    torch.save(loop.train_history.state_dict(), os.path.join(out_dir, f'history_rank{dist.get_rank()}.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
