"""Resume, on a machine without CUDA (CUDA_VISIBLE_DEVICES=''), the run test_resume_gpu.py started on a GPU.

Usage: python resume_on_cpu.py RESULTS_DIR CHECKPOINT_PATH RESULT_FILE"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from aitoolbox_like.tracking import TrainLoopCheckpoint    # noqa: E402
from gpu_common import parts, weights                      # noqa: E402

EPOCHS = 4


def main(results_dir, checkpoint, result_file):
    torch.set_num_threads(1)        # as the test process: CPU results depend on the thread count
    # Other initial weights and RNG state than the first process: the checkpoint must restore both.
    model, train, val, optimizer = parts(torch.device('cpu'), seed=5)
    torch.manual_seed(999)
    loop = TrainLoopCheckpoint(model, train, val, None, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                               results_dir, {'lr': 1e-3}, cloud_save_mode='local', progress_bar=False)
    loop.fit(num_epochs=EPOCHS, resume_from=checkpoint)
    torch.save({'weights': weights(model), 'device': str(loop.device), 'cuda_available': torch.cuda.is_available(),
                'accumulated_loss': loop.train_history['accumulated_loss']}, result_file)


if __name__ == '__main__':
    main(*sys.argv[1:4])
