"""A checkpoint written on a GPU resumes on a machine without one: the run continues exactly as the hand-written
loop that trains the first epochs on the GPU and the rest on the CPU (the weights and the optimizer state moved
over), to the bit. The checkpoint goes through the background writer's pinned-memory copy of GPU tensors."""
import os
import subprocess
import sys

import torch
from torch import nn

from aitoolbox_like.tracking import TrainLoopCheckpoint
from gpu_common import differing, hand_written, parts, weights

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, 'resume_on_cpu.py')
GPU_EPOCHS, EPOCHS = 2, 4       # as resume_on_cpu.py
CPU = torch.device('cpu')


def test_checkpoint_written_on_gpu_resumes_on_a_machine_without_cuda(device, tmp_path):
    ref_model, train, _, ref_opt = parts(device)
    torch.manual_seed(11)
    hand_written(ref_model, ref_opt, train, device, GPU_EPOCHS)
    ref_model.to(CPU)
    ref_opt.load_state_dict(ref_opt.state_dict())       # the optimizer state follows its parameters to the CPU
    hand_written(ref_model, ref_opt, train, CPU, EPOCHS - GPU_EPOCHS)

    model, train, val, opt = parts(device)
    torch.manual_seed(11)
    results = str(tmp_path / 'results')
    loop = TrainLoopCheckpoint(model, train, val, None, opt, nn.CrossEntropyLoss(), 'proj', 'run', results,
                               {'lr': 1e-3}, cloud_save_mode='local', progress_bar=False)
    loop.fit(num_epochs=GPU_EPOCHS)
    assert loop.device.type == device.type
    folder = os.path.join(loop.experiment.dir_path, 'checkpoint_model')
    checkpoint = os.path.join(folder, sorted(f for f in os.listdir(folder) if f.endswith('.pth'))[-1])
    assert checkpoint.endswith(f'_E{GPU_EPOCHS - 1}.pth')

    result_file = str(tmp_path / 'resumed.pt')
    env = dict(os.environ, CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH')) if p))
    process = subprocess.run([sys.executable, SCRIPT, results, checkpoint, result_file], env=env,
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr[-3000:]
    resumed = torch.load(result_file, weights_only=True)

    assert resumed['device'] == 'cpu' and resumed['cuda_available'] is False
    assert not differing(resumed['weights'], weights(ref_model)), differing(resumed['weights'], weights(ref_model))
    assert resumed['accumulated_loss'][:GPU_EPOCHS] == loop.train_history['accumulated_loss']
    assert len(resumed['accumulated_loss']) == EPOCHS
