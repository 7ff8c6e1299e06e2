"""The end of a tracking loop's fit: what a user waits for after the last epoch.

A ``TrainLoopCheckpointEndSave`` (a checkpoint every epoch, the final model and the result packages' results at the
end, AIToolbox's tracking loop) trains an MLP for a few epochs, with the accuracy on the training and validation sets
after every epoch, and saves locally or to a real S3 server on loopback (SeaweedFS, the tests' ``weed mini``). From the end of the last epoch to ``fit`` returning, three spans are timed:

- **end-of-training evaluation**: the test loss ('train_end_test_loss');
- **on_train_end**: the callbacks' end: the last checkpoint's write, the final model, the validation and test
  predictions, the results file, the history plots, the uploads handed to the background uploader;
- **upload wait**: ``fit`` waiting for the pending uploads (nothing is lost: the end of fit waits until every file is
  in the bucket).

Each span is the median over ``--repeats`` fits; ``--profile`` prints the ten costliest calls of the end.

Usage: python benchmarks/fit_end.py [--cloud local|s3] [--epochs E] [--hidden H] [--repeats N] [--profile]
"""
import argparse
import cProfile
import io
import logging
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tests' / 'support'))
from aitoolbox_like import AbstractCallback, TTBasicModel  # noqa: E402
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation  # noqa: E402
from aitoolbox_like.results import ClassificationResultPackage  # noqa: E402
from aitoolbox_like.train_loop import TrainLoopCheckpointEndSave  # noqa: E402


class MLP(TTBasicModel):
    def __init__(self, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


class Marks(AbstractCallback):
    """Clock readings: the last epoch's end, and the first and last callback's on_train_end."""

    def __init__(self, times, key, order):
        super().__init__(f'mark {key}', execution_order=order)
        self.times, self.key = times, key

    def on_epoch_end(self):
        if self.key == 'last':
            self.times['epoch_end'] = time.perf_counter()

    def on_train_end(self):
        self.times[self.key] = time.perf_counter()


def data(n, generator):
    return TensorDataset(torch.randn(n, 784, generator=generator), torch.randint(0, 10, (n,), generator=generator))


def one_fit(args, folder, cloud, profile=None):
    g = torch.Generator().manual_seed(0)
    train, val, test = (DataLoader(data(n, g), batch_size=64) for n in (2048, 512, 512))
    torch.manual_seed(0)
    model = MLP(args.hidden)
    times = {}
    loop = TrainLoopCheckpointEndSave(
        model, train, val, test, torch.optim.Adam(model.parameters(), lr=1e-3), nn.CrossEntropyLoss(),
        'bench', 'fit_end', folder, {'hidden': args.hidden}, val_result_package=ClassificationResultPackage(),
        test_result_package=ClassificationResultPackage(), cloud_save_mode=cloud, bucket_name='bench',
        progress_bar=False)

    class Profile(AbstractCallback):
        def __init__(self):
            super().__init__('profile', execution_order=10 ** 9)

        def on_epoch_end(self):
            if profile is not None and self.train_loop_obj.epoch == args.epochs - 1:
                profile.enable()
    # The accuracy on the training and validation sets after every epoch: with the losses, four history charts.
    metrics = ModelPerformanceEvaluation(ClassificationResultPackage(), {}, on_train_data=True)
    loop.fit(num_epochs=args.epochs, callbacks=[metrics, Marks(times, 'first', -10 ** 9), Marks(times, 'last', 10 ** 9),
                                                Profile()])
    returned = time.perf_counter()
    if profile is not None:
        profile.disable()
    return {'end-of-training evaluation': times['first'] - times['epoch_end'],
            'on_train_end': times['last'] - times['first'],
            'upload wait': returned - times['last'],
            'whole end': returned - times['epoch_end']}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cloud', choices=('local', 's3'), default='s3')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--hidden', type=int, default=512)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--profile', action='store_true')
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger('aitoolbox_like').setLevel(logging.WARNING)
    warnings.simplefilter('ignore')
    work = Path(tempfile.mkdtemp(prefix='fit_end_'))
    server = None
    try:
        if args.cloud == 's3':
            from s3_server import SeaweedS3Server, find_weed
            server = SeaweedS3Server(find_weed(), work / 'weed')
            os.environ.update(AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
                              AWS_EC2_METADATA_DISABLED='true')
            server.start()
            os.environ['AWS_ENDPOINT_URL_S3'] = server.endpoint_url
            server.client().create_bucket(Bucket='bench')
        spans = []
        for repeat in range(args.repeats + 1):        # the first fit imports what the end uses: left out
            spans.append(one_fit(args, str(work / f'run{repeat}'), args.cloud))
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            one_fit(args, str(work / 'profiled'), args.cloud, profile)
    finally:
        if server is not None:
            server.stop(graceful=False)
        shutil.rmtree(work, ignore_errors=True)
    params = sum(p.numel() for p in MLP(args.hidden).parameters())
    print(f'TrainLoopCheckpointEndSave, MLP 784-{args.hidden}-{args.hidden}-10 ({params / 1e6:.2f} M parameters, '
          f'Adam), {args.epochs} epochs, cloud_save_mode={args.cloud!r}; the end of fit in seconds, median of '
          f'{args.repeats} fits (the first fit, which imports what the end uses, left out; its whole end: '
          f'{spans[0]["whole end"]:.2f} s):')
    for name in spans[0]:
        print(f'  {name + ":":<30} {statistics.median(s[name] for s in spans[1:]):.3f}')
    if profile is not None:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats('cumulative').print_stats(25)
        print(text.getvalue())


if __name__ == '__main__':
    main()
