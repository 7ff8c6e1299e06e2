"""`aitoolbox-like resume s3://...` of a sharded (FSDP, 2 CPU processes) recipe run whose machine was lost during
its last epoch: only the bucket is left, up to the checkpoint of the epoch before, and the S3 endpoint is known from
--endpoint-url alone. The resumed run downloads that checkpoint into the experiment folder where it expects it and
writes the same last checkpoint as the run did uninterrupted, bit for bit (same seed, same number of processes)."""
import os
import shutil

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from aitoolbox_like.checkpoint import sharded as sharded_checkpoint
from aitoolbox_like.experiment import find_cloud_checkpoint
from aitoolbox_like.recipes.cli import main
from aitoolbox_like.storage.s3 import S3Storage
from s3_server import make_bucket

PARTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'recipe_parts.py')


def _recipe(tmp_path, bucket):
    path = tmp_path / 'fsdp.yaml'
    path.write_text(f'''
imports: [{PARTS}]
seed: 0
data: {{name: tiny_loaders}}
model: {{name: TinyNet}}
optimizer: {{name: Adam, lr: 0.01}}
criterion: {{name: CrossEntropyLoss}}
loop: {{name: TrainLoopCheckpoint, project_name: tiny, experiment_name: fsdp, hyperparams: {{lr: 0.01}},
       local_model_result_folder_path: {tmp_path / 'runs'}, cloud_save_mode: s3, bucket_name: {bucket},
       cloud_dir_prefix: runs, gpu_mode: fsdp, progress_bar: false}}
fit: {{num_epochs: 2, num_gpus: 2, on_gpu: false, fsdp_min_num_params: 0}}
''')
    return str(path)


def _whole_state(storage, folder_key, into):
    """The whole model and optimizer state of the sharded checkpoint stored under ``folder_key``."""
    folder = sharded_checkpoint.download(storage, folder_key, str(into / 'checkpoint.dcp'))
    dcp_to_torch_save(folder, str(into / 'whole.pt'))
    return torch.load(into / 'whole.pt', weights_only=True)


def _assert_equal(resumed, uninterrupted, where=''):
    if isinstance(uninterrupted, dict):
        assert resumed.keys() == uninterrupted.keys(), where
        for key in uninterrupted:
            _assert_equal(resumed[key], uninterrupted[key], f'{where}.{key}')
    elif isinstance(uninterrupted, torch.Tensor):
        assert torch.equal(resumed, uninterrupted), where
    else:
        assert resumed == uninterrupted, where


@pytest.mark.timeout(300)
def test_fsdp_recipe_run_resumes_from_the_bucket_alone_as_if_never_interrupted(s3_server, tmp_path, monkeypatch,
                                                                                 capsys):
    monkeypatch.setenv('AWS_ENDPOINT_URL_S3', s3_server.endpoint_url)    # the spawned processes inherit it
    bucket = make_bucket(s3_server)
    storage = S3Storage(bucket, 'runs', endpoint_url=s3_server.endpoint_url)
    assert main(['train', _recipe(tmp_path, bucket)]) == 0
    [name] = os.listdir(tmp_path / 'runs' / 'tiny')
    last = f'tiny/{name}/checkpoint_model/model_{name}_E1.dcp'
    assert find_cloud_checkpoint(storage, f'tiny/{name}') == f'{last}/{sharded_checkpoint.MARKER}'
    (tmp_path / 'uninterrupted').mkdir()
    uninterrupted = _whole_state(storage, last, tmp_path / 'uninterrupted')

    # The run as a machine lost during epoch 1 leaves it: the bucket has everything up to the checkpoint of epoch 0.
    for key in storage.list(f'{last}/'):
        storage.delete(key)
    shutil.rmtree(tmp_path / 'runs')
    monkeypatch.delenv('AWS_ENDPOINT_URL_S3')       # the resume knows the server from --endpoint-url alone
    uri = f's3://{bucket}/runs/tiny/{name}'
    assert main(['resume', '--endpoint-url', s3_server.endpoint_url, uri]) == 0
    assert 'AWS_ENDPOINT_URL_S3' not in os.environ       # set for the resumed run only
    # The checkpoint it continued from was downloaded where the run keeps its checkpoints.
    assert sharded_checkpoint.is_sharded_checkpoint(
        tmp_path / 'runs' / 'tiny' / name / 'checkpoint_model' / f'model_{name}_E0.dcp')

    (tmp_path / 'resumed').mkdir()
    _assert_equal(_whole_state(storage, last, tmp_path / 'resumed'), uninterrupted)   # weights, Adam's moments

    capsys.readouterr()
    assert main(['resume', '--endpoint-url', s3_server.endpoint_url, uri]) == 0
    assert 'finished: 2 epochs trained (fit.num_epochs=2)' in capsys.readouterr().out

    # A newest checkpoint that cannot be read (a damaged upload) is named, with what to do, instead of a traceback.
    damaged = f'tiny/{name}/checkpoint_model/model_{name}_E2.dcp'
    storage.write_text(f'{damaged}/{sharded_checkpoint.TRAIN_STATE_FILE}', 'not a checkpoint')
    storage.write_text(f'{damaged}/{sharded_checkpoint.MARKER}', '')
    assert main(['resume', '--endpoint-url', s3_server.endpoint_url, uri, 'fit.num_epochs=3']) == 1
    out = capsys.readouterr().out
    assert f'{damaged}/{sharded_checkpoint.TRAIN_STATE_FILE}' in out
    assert 'Remove it to resume from the one before' in out
    assert f'copy {uri}/recipe.yaml here, then aitoolbox-like train recipe.yaml' in out     # `train` reads local files
