"""ThroughputMonitor on a GPU: the peak CUDA memory of each epoch goes into the history."""
import torch
from torch import nn

from aitoolbox_like import TrainLoop
from aitoolbox_like.callbacks.monitoring import ThroughputMonitor
from gpu_common import parts


def test_throughput_monitor_records_cuda_memory_on_a_gpu(device):
    model, train, val, opt = parts(device)
    loop = TrainLoop(model, train, val, None, opt, nn.CrossEntropyLoss(), progress_bar=False)
    loop.fit(num_epochs=2, callbacks=[ThroughputMonitor()])
    if device.type != 'cuda':
        assert 'cuda_max_memory_allocated_mb' not in loop.train_history
        return
    values = loop.train_history['cuda_max_memory_allocated_mb']
    assert len(values) == 2 and all(v > 0 for v in values)
    assert torch.cuda.max_memory_allocated(device) > 0
