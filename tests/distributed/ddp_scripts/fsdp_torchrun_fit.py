"""Started by tests/distributed/test_fsdp_callbacks.py with `python -m torch.distributed.run --nproc_per_node=2 fsdp_torchrun_fit.py
OUT_DIR`: an FSDP fit under torchrun (fsdp_common's loop: sharded checkpoints, clipping, EMA; the default shard
policy), with TensorBoard histograms of the whole parameters. Rank 0 saves the whole trained weights."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch                                                      # noqa: E402
import torch.distributed as dist                                 # noqa: E402

from aitoolbox_like.checkpoint import sharded as sharded_checkpoint  # noqa: E402
from aitoolbox_like.callbacks.tensorboard import TensorboardParameterHistograms  # noqa: E402
from aitoolbox_like.distributed import is_fsdp_model             # noqa: E402
from fsdp_common import callbacks, tracked_loop                  # noqa: E402


def main(out_dir):
    loop = tracked_loop(out_dir)
    histograms = TensorboardParameterHistograms(log_gradients=False, log_dir=os.path.join(out_dir, 'tb'),
                                                is_project=False)
    trained = loop.fit(num_epochs=2, callbacks=callbacks() + [histograms], on_gpu=False)
    assert trained is loop.model and is_fsdp_model(trained)      # under torchrun: this process's sharded module
    # It ran on every rank during the FSDP fit (its gather is a collective); the user's object keeps its own gate.
    assert histograms.device_idx_execution == 0
    model_state, _ = sharded_checkpoint.full_state(loop)         # every rank gathers; rank 0 gets the whole state
    if dist.get_rank() == 0:
        torch.save(model_state, os.path.join(out_dir, 'weights.pt'))
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
