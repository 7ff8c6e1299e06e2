"""Started by tests/distributed/test_fsdp.py in its own session: an FSDP run (2 CPU processes) checkpointing every epoch that
kills itself (every process, kill -9) during the step of global batch KILL_AT.

python fsdp_kill_script.py OUT_DIR KILL_AT
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsdp_common import KillAt, callbacks, shard_each_layer, tracked_loop  # noqa: E402

if __name__ == '__main__':
    loop = tracked_loop(sys.argv[1])
    loop.fit(num_epochs=3, callbacks=callbacks() + [KillAt(int(sys.argv[2]))], num_gpus=2, on_gpu=False,
             fsdp_shard_fn=shard_each_layer)
    raise SystemExit('the run was not killed')
