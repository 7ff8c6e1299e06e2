"""A user's cloud run with INFO logging: ``logging.basicConfig(level=logging.INFO)``, then a fit that checkpoints every
epoch to the cloud (used by test_sdk_log_noise.py, which counts the lines the run logs).

python sdk_log_script.py OUT_DIR MODE BUCKET [--epochs N] [--level LOGGER=LEVEL ...]

``--level`` sets a logger's level before the fit, as a user who wants a client library's log does. The cloud's endpoint
comes from the environment (AWS_ENDPOINT_URL_S3, STORAGE_EMULATOR_HOST, AZURE_STORAGE_CONNECTION_STRING).
"""
import argparse
import logging

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from aitoolbox_like import TTBasicModel
from aitoolbox_like.tracking import TrainLoopCheckpoint


class Net(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('out_dir')
    parser.add_argument('mode')
    parser.add_argument('bucket')
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--level', action='append', default=[])
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO)
    for setting in args.level:
        name, _, level = setting.partition('=')
        logging.getLogger(name).setLevel(level)

    torch.manual_seed(0)
    model = Net()
    loop = TrainLoopCheckpoint(model, DataLoader(data(24, 1), batch_size=8), DataLoader(data(8, 2), batch_size=8),
                               None, torch.optim.Adam(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(), 'proj',
                               'run', args.out_dir, {'lr': 1e-2}, cloud_save_mode=args.mode, bucket_name=args.bucket,
                               cloud_dir_prefix='runs', progress_bar=False)
    loop.fit(num_epochs=args.epochs)


if __name__ == '__main__':
    main()
