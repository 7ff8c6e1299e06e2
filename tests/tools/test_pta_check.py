"""make pta-check's own machinery (tools/pta_check), without the network: it reads the literal blocks of an rst page,
mends the page's metrics example only where the issue says, tells two runs apart by any printed line, file or weight,
and finds an installed file that is not the published wheel's. The check itself runs in CI as `make pta-check`."""
import base64
import csv
import hashlib
import io
import zipfile
from importlib import metadata
from pathlib import Path

import torch

from tools.pta_check import runs, seed, wheel

PAGE = '''Title
=====

Here is an example::

    class Metrics(TrainerCallback):
    def __init__(self, num_classes):
        self.accuracy = Accuracy(num_classes=num_classes)

    def on_eval_epoch_end(self, trainer, **kwargs):
        trainer.run_history.update_metric("accuracy", 1)

.. Note::
    Not a code block.

Custom events::

    class Verify(TrainerCallback):
        def verify(self, trainer, xb):
            assert xb.shape[0] == 2
'''


def test_the_literal_blocks_of_the_page_are_read_dedented_and_directives_are_skipped():
    blocks = seed.literal_blocks(PAGE)
    assert len(blocks) == 2
    assert blocks[0].startswith('class Metrics(TrainerCallback):\ndef __init__')
    assert blocks[1] == 'class Verify(TrainerCallback):\n    def verify(self, trainer, xb):\n' \
                        '        assert xb.shape[0] == 2\n'


def test_the_metrics_example_is_mended_only_by_its_indentation_and_torchmetrics_task():
    block = seed.literal_blocks(PAGE)[0]
    mended = seed.metrics_example(block)
    compile(mended, 'mended', 'exec')
    assert [line.strip() for line in mended.splitlines()] == \
        [line.strip().replace('(num_classes=num_classes)', "(task='multiclass', num_classes=num_classes)")
         for line in block.splitlines()]


def _run(lines=('a',), files=None, weights=None, exit=None):
    return runs.Run(lines=list(lines), files=files or {'best_model.pt': {'w': torch.ones(2)}},
                    weights=weights or {'w': torch.zeros(2)}, exit=exit)


def test_two_runs_differ_by_any_printed_line_file_content_exit_or_weight():
    assert runs.first_difference(_run(), _run()) is None
    assert 'printed line 2' in runs.first_difference(_run(('a', 'b')), _run(('a',)))
    assert 'content of best_model.pt' in runs.first_difference(
        _run(files={'best_model.pt': {'w': torch.tensor([1.0, 1.0 + 1e-7])}}), _run())
    assert 'files' in runs.first_difference(_run(files={'other.pt': {}}), _run())
    assert 'ended' in runs.first_difference(_run(exit='Exiting due to NaN loss'), _run())
    assert runs.first_difference(_run(weights={'w': torch.zeros(2, dtype=torch.float64)}), _run()) == \
        'the final weights'


def _wheel(tmp_path, files):
    path = tmp_path / 'pytorch_accelerated-0.1.61-py3-none-any.whl'
    record = io.StringIO()
    with zipfile.ZipFile(path, 'w') as archive:
        for name, data in files.items():
            archive.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
            csv.writer(record).writerow([name, f'sha256={digest}', len(data)])
        archive.writestr('pytorch_accelerated-0.1.61.dist-info/RECORD', record.getvalue())
    return path


def test_an_installed_file_that_is_not_the_published_ones_is_named(tmp_path):
    installed = Path(str(metadata.distribution('pytorch-accelerated').locate_file('')))
    callbacks = (installed / 'pytorch_accelerated' / 'callbacks.py').read_bytes()
    assert wheel.differences_from_installed(_wheel(tmp_path, {'pytorch_accelerated/callbacks.py': callbacks})) == []
    changed = _wheel(tmp_path, {'pytorch_accelerated/callbacks.py': callbacks + b'\n# changed\n',
                                'pytorch_accelerated/missing.py': b''})
    assert wheel.differences_from_installed(changed) == [
        'pytorch_accelerated/callbacks.py: the installed file differs from the published one',
        'pytorch_accelerated/missing.py: not installed']
