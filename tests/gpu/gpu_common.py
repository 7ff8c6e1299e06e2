"""Models, data and hand-written reference loops of the GPU tests. A module (not a test file), so that spawned
processes and the resume script import it by name."""
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import AbstractCallback, TTBasicModel

IN_FEATURES, CLASSES = 32, 4


class Net(TTBasicModel):
    """Linear layers only (their CUDA kernels give the same bits run after run, unlike some convolution
    backward kernels); dropout draws from the RNG of the device it runs on."""

    def __init__(self, dropout=0.1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN_FEATURES, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, 64),
                                 nn.ReLU(), nn.Linear(64, CLASSES))

    def forward(self, x):
        return self.net(x)


def dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN_FEATURES, generator=g)
    y = ((x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()).clamp(max=CLASSES - 1)
    return TensorDataset(x, y)


def loaders(n_train=96, batch_size=16, shuffle=True):
    """Train loader (shuffled by the global CPU RNG, as most scripts do), validation loader."""
    return (DataLoader(dataset(n_train, 1), batch_size=batch_size, shuffle=shuffle),
            DataLoader(dataset(40, 2), batch_size=batch_size))


def make_optimizer(kind, params):
    if kind == 'sgd':
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if kind == 'adam':
        return torch.optim.Adam(params, lr=1e-3)
    if kind == 'adam_fused':
        return torch.optim.Adam(params, lr=1e-3, fused=True)
    raise ValueError(kind)


def parts(device, seed=0, optimizer='adam', dropout=0.1, shuffle=True):
    """Model (on ``device``), train and validation loaders, optimizer: built the same way by every run."""
    torch.manual_seed(seed)
    model = Net(dropout).to(device)
    train, val = loaders(shuffle=shuffle)
    return model, train, val, make_optimizer(optimizer, model.parameters())


def weights(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def differing(a, b):
    """The keys whose tensors differ, each with its largest absolute difference (empty when equal to the bit)."""
    assert a.keys() == b.keys()
    return {k: (a[k].double() - b[k].double()).abs().max().item() for k in a if not torch.equal(a[k], b[k])}


def hand_written_amp(model, optimizer, train, device, num_epochs, amp, scaler_kwargs=None, grad_accumulation=1):
    """The PyTorch recipe (torch.autocast, and for float16 a GradScaler): returns, per batch, whether the
    optimizer's update was applied (False where the scaler skipped it, or on an accumulation micro-batch).

    The gradients are unscaled before the step (``scaler.unscale_``), as the AMP recipe does for clipping or
    inspecting them; the loop does it too, so its callbacks see real gradients."""
    dtype = {'fp16': torch.float16, 'bf16': torch.bfloat16}.get(amp)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == 'fp16', **(scaler_kwargs or {}))
    criterion = nn.CrossEntropyLoss()
    applied = []
    model.train()
    for _ in range(num_epochs):
        for i, (x, y) in enumerate(train):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = criterion(model(x.to(device)), y.to(device))
            if grad_accumulation > 1:
                loss = loss / grad_accumulation
            scaler.scale(loss).backward()
            if (i + 1) % grad_accumulation and i != len(train) - 1:
                applied.append(False)
                continue
            scale = scaler.get_scale() if scaler.is_enabled() else None
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            applied.append(scale is None or scaler.get_scale() >= scale)
    return applied


def hand_written(model, optimizer, train, device, num_epochs):
    """Plain float32 training by hand."""
    criterion = nn.CrossEntropyLoss()
    model.train()
    for _ in range(num_epochs):
        for x, y in train:
            criterion(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
            optimizer.zero_grad()


class Recorder(AbstractCallback):
    """Records, in ``log``, each batch it sees: (its name, the loss's device, the first parameter's device)."""

    def __init__(self, name, log, device_idx_execution=None):
        super().__init__(name, device_idx_execution=device_idx_execution)
        self.log = log

    def on_batch_end(self):
        loop = self.train_loop_obj
        self.log.append((self.callback_name, str(loop.loss.device), str(next(loop.model.parameters()).device)))


class AppliedRecorder(AbstractCallback):
    """Records ``optimizer_update_applied()`` after each batch."""

    def __init__(self):
        super().__init__('applied recorder')
        self.applied = []

    def on_batch_end(self):
        self.applied.append(self.train_loop_obj.optimizer_update_applied())


class FileMarker(AbstractCallback):
    """For runs in other processes: at the end of training, writes ``<out_dir>/<name>.json`` with the process's
    rank, the number of processes, the loop's device, the first parameter's device and the batches it saw."""

    def __init__(self, name, out_dir, device_idx_execution=None):
        super().__init__(name, device_idx_execution=device_idx_execution)
        self.out_dir = out_dir
        self.batches = 0

    def on_batch_end(self):
        self.batches += 1

    def on_train_end(self):
        loop = self.train_loop_obj
        record = dict(rank=loop.global_rank, world_size=loop.world_size, device=str(loop.device),
                      parameter_device=str(next(loop.model.parameters()).device), batches=self.batches)
        with open(os.path.join(self.out_dir, f'{self.callback_name}.json'), 'w', encoding='utf-8') as f:
            json.dump(record, f)
