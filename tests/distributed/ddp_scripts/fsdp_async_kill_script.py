"""Started by tests/distributed/test_fsdp_checkpoints.py in its own session, with fsdp_checkpoint_common.BLOCK_WRITE_ENV set: an
FSDP run (2 CPU processes, asynchronous sharded checkpoints every epoch) whose storage stalls during a background
checkpoint write; the test kills every process (kill -9) once training went on past it.

python fsdp_async_kill_script.py OUT_DIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsdp_checkpoint_common import TrainedWhileBlocked, checkpoint_loop  # noqa: E402
from fsdp_common import callbacks, shard_each_layer  # noqa: E402

if __name__ == '__main__':
    loop = checkpoint_loop(sys.argv[1])
    loop.fit(num_epochs=3, callbacks=callbacks() + [TrainedWhileBlocked(sys.argv[1])], num_gpus=2, on_gpu=False,
             fsdp_shard_fn=shard_each_layer)
    raise SystemExit('the run was not killed')
