"""RNG capture: every random-number state a training trajectory can depend on (torch, CUDA, Python, NumPy and the
train loader's own generators), taken and put back as one dict of tensors, numbers and strings (weights_only-safe).
A checkpoint holds the state at its save and at the start of its epoch (the epoch's data order comes from it)."""
import logging
import random
from typing import Any, Tuple, cast

import torch

from ...runtime.devices import cuda_is_available

logger = logging.getLogger(__name__)

def _loader_generators(loop):
    loader = loop.train_loader
    found = {}
    for name, owner in (('loader', loader), ('sampler', getattr(loader, 'sampler', None)),
                        ('batch_sampler', getattr(getattr(loader, 'batch_sampler', None), 'sampler', None))):
        generator = getattr(owner, 'generator', None)
        if isinstance(generator, torch.Generator):
            found[name] = generator
    return found

def capture_rng_state(loop):
    """Every random-number state the training trajectory can depend on."""
    state = {'torch': torch.get_rng_state(), 'python': _python_rng_state()}
    numpy_state = _numpy_rng_state()
    if numpy_state is not None:
        state['numpy'] = numpy_state
    if torch.cuda.is_initialized():
        state['cuda'] = list(torch.cuda.get_rng_state_all())
    state['loader_generators'] = {name: g.get_state() for name, g in _loader_generators(loop).items()}
    return state

def restore_rng_state(loop, state):
    torch.set_rng_state(state['torch'])
    if 'python' in state:
        version, internal, gauss = state['python']
        random.setstate((version, tuple(internal), gauss))
    if 'numpy' in state:
        _set_numpy_rng_state(state['numpy'])
    if state.get('cuda') and cuda_is_available():
        cuda_states = state['cuda']
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:
            logger.warning('Checkpoint has CUDA RNG states of %d devices, this machine has %d; CUDA RNG not restored',
                           len(cuda_states), torch.cuda.device_count())
    generators = _loader_generators(loop)
    for name, generator_state in state.get('loader_generators', {}).items():
        if name in generators:
            generators[name].set_state(generator_state)

def _python_rng_state():
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]

def _numpy_rng_state():
    try:
        import numpy as np
    except ImportError:
        return None
    name, keys, pos, has_gauss, cached = cast(Tuple[str, Any, int, int, float], np.random.get_state(legacy=True))
    return {'name': name, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
            'has_gauss': int(has_gauss), 'cached_gaussian': float(cached)}

def _set_numpy_rng_state(state):
    import numpy as np
    np.random.set_state((state['name'], state['keys'].numpy().astype(np.uint32), state['pos'],
                         state['has_gauss'], state['cached_gaussian']))
