"""The examples of pytorch-accelerated's callbacks page (../shared/seeds/pytorch-accelerated-callbacks.rst), read from
the page at run time and run as written there: side by side on PTA's Trainer and on the TrainLoop.

Two mechanical changes to the metrics example, and only these: its class body is indented (the page prints it at the
class line's indentation, which Python rejects), and torchmetrics' ``task`` argument is added (required since
torchmetrics 0.11, after the page was written)."""
import contextlib
import io
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.abstract import AbstractCallback

from . import runs
from .scenarios import Tally

PAGE = 'pytorch-accelerated-callbacks.rst'


def literal_blocks(text: str) -> List[str]:
    """The reStructuredText literal blocks (the indented lines after a paragraph ending in ``::``), dedented."""
    lines, blocks = text.splitlines(), []
    for index, line in enumerate(lines):
        if not line.rstrip().endswith('::') or line.lstrip().startswith('..'):
            continue
        body = []
        for following in lines[index + 1:]:
            if following.strip() and not following.startswith((' ', '\t')):
                break
            body.append(following)
        while body and not body[-1].strip():
            body.pop()
        indent = min(len(b) - len(b.lstrip()) for b in body if b.strip())
        blocks.append('\n'.join(b[indent:] for b in body).strip('\n') + '\n')
    return blocks


def _indent_class_body(code: str) -> str:
    out, in_class = [], False
    for line in code.splitlines():
        if line.startswith('class '):
            in_class = True
            out.append(line)
        elif in_class and line.strip():
            out.append('    ' + line)
        else:
            out.append(line)
    return '\n'.join(out) + '\n'


def metrics_example(block: str) -> str:
    return _indent_class_body(block).replace('(num_classes=num_classes)', "(task='multiclass', num_classes=num_classes)")


class Images(TTBasicModel):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class CallVerifyBatch(AbstractCallback):
    """Where a TrainLoop user fires a custom event with the step's batch (docs/callbacks/pytorch_accelerated.md)."""

    def __init__(self) -> None:
        super().__init__('calls verify_train_batch')

    def on_batch_begin(self) -> None:
        xb, yb = self.train_loop_obj.batch
        self.train_loop_obj.callbacks_handler.call_event('verify_train_batch', trainer=self.train_loop_obj,
                                                         xb=xb, yb=yb)


def seed_examples(tally: Tally, seeds: Path, work: Path) -> None:
    page = seeds / PAGE
    blocks = literal_blocks(page.read_text())
    metrics = next(b for b in blocks if 'class ClassificationMetricsCallback' in b)
    custom = next(b for b in blocks if 'class VerifyBatchCallback' in b)
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import LogMetricsCallback, TrainerCallback

    from torchmetrics import Accuracy, ConfusionMatrix

    namespace: Dict[str, Any] = {'TrainerCallback': TrainerCallback, 'Trainer': Trainer,
                                 'ConfusionMatrix': ConfusionMatrix, 'Accuracy': Accuracy}
    exec(compile(metrics_example(metrics), f'{PAGE}: ClassificationMetricsCallback', 'exec'), namespace)
    exec(compile(custom, f'{PAGE}: VerifyBatchCallback', 'exec'), namespace)

    def metrics_side_by_side() -> Optional[str]:
        callbacks = lambda: [namespace['ClassificationMetricsCallback'](num_classes=3), LogMetricsCallback()]  # noqa
        theirs = runs.on_ptas_trainer(work / 'seed_metrics' / 'pta', callbacks(), num_epochs=2)
        ours = runs.on_the_loop(work / 'seed_metrics' / 'loop', callbacks(), num_epochs=2)
        if not any(line.startswith('accuracy: ') for line in theirs.lines):
            return 'no accuracy printed by PTA\'s run'
        return runs.first_difference(ours, theirs)

    def custom_event(size: int) -> Optional[str]:
        """The callback on the TrainLoop as written; on PTA's own Trainer the page's example ends with a TypeError
        (``trainer.run_config[...]``: PTA's TrainerRunConfig is a dataclass, not subscriptable), shown for the
        record."""
        images = TensorDataset(torch.randn(32, 1, size, size), torch.randint(0, 10, (32,)))
        outcomes = []
        for on_ptas_trainer in (True, False):
            torch.manual_seed(0)
            model = Images()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    if on_ptas_trainer:
                        trainer = namespace['TrainerWithCustomCallbackEvent'](
                            model, nn.CrossEntropyLoss(), optimizer, callbacks=[namespace['VerifyBatchCallback']])
                        trainer.train(train_dataset=images, num_epochs=1, per_device_batch_size=8,
                                      train_dataloader_kwargs={'num_workers': 0})
                    else:
                        loop = TrainLoop(model, DataLoader(images, batch_size=8), None, None, optimizer,
                                         nn.CrossEntropyLoss(), progress_bar=False)
                        loop.fit(num_epochs=1, callbacks=[namespace['VerifyBatchCallback'](), CallVerifyBatch()])
                outcomes.append('passed')
            except (AssertionError, TypeError) as error:
                outcomes.append(type(error).__name__)
        expected = 'passed' if size == 28 else 'AssertionError'
        record = f"(PTA's Trainer: {outcomes[0]})"
        return None if outcomes[1] == expected else f'TrainLoop: {outcomes[1]}, expected {expected} {record}'

    tally.expect(f'{PAGE}: ClassificationMetricsCallback, side by side', metrics_side_by_side)
    tally.expect(f'{PAGE}: VerifyBatchCallback\'s custom event holds for 28x28 batches', lambda: custom_event(28))
    tally.expect(f'{PAGE}: VerifyBatchCallback\'s custom event fails for 14x14 batches', lambda: custom_event(14))

