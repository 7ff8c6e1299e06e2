"""A recipe run saving to each cloud (S3, Google Cloud Storage, Azure: the ``cloud`` fixture's real servers):
recipe.yaml and command_line.txt are uploaded with the hyperparameter files, and `aitoolbox-like resume s3://...`
(gs://, az://) continues the run from the bucket alone."""
import os
import shutil

import pytest
import torch

from aitoolbox_like.experiment import find_cloud_checkpoint
from aitoolbox_like.recipes.cli import main

PARTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'recipe_parts.py')


def _recipe(tmp_path, cloud, bucket, name):
    path = tmp_path / f'{name}.yaml'
    path.write_text(f'''
imports: [{PARTS}]
seed: 0
data: {{name: tiny_loaders}}
model: {{name: TinyNet}}
optimizer: {{name: Adam, lr: 0.01}}
criterion: {{name: CrossEntropyLoss}}
loop: {{name: TrainLoopCheckpoint, project_name: tiny, experiment_name: {name}, hyperparams: {{lr: 0.01}},
       local_model_result_folder_path: {tmp_path / name}, cloud_save_mode: {cloud.mode}, bucket_name: {bucket},
       cloud_dir_prefix: runs, progress_bar: false}}
fit: {{num_epochs: 3}}
''')
    return str(path)


def _weights(storage, folder_key):
    local = storage.load_file(find_cloud_checkpoint(storage, folder_key),
                              os.path.join(os.getcwd(), 'downloaded.pth'))
    return torch.load(local, weights_only=True)['model_state_dict']


@pytest.mark.timeout(180)
def test_recipe_files_go_to_the_cloud_and_a_run_resumes_from_the_bucket(cloud, tmp_path, capsys):
    bucket = cloud.make_bucket()
    storage = cloud.storage(bucket, 'runs')
    assert main(['train', _recipe(tmp_path, cloud, bucket, 'full')]) == 0
    assert main(['train', _recipe(tmp_path, cloud, bucket, 'cut'), 'fit.num_epochs=2']) == 0   # stopped after 2
    [cut] = os.listdir(tmp_path / 'cut' / 'tiny')
    [full] = os.listdir(tmp_path / 'full' / 'tiny')
    for name in ('recipe.yaml', 'command_line.txt', 'hyperparams_list.txt'):
        with open(tmp_path / 'cut' / 'tiny' / cut / name) as f:
            assert storage.read_text(f'tiny/{cut}/{name}') == f.read(), name

    shutil.rmtree(tmp_path / 'cut')       # the machine is gone; only the bucket is left
    uri = f'{cloud.scheme}://{bucket}/runs/tiny/{cut}'
    capsys.readouterr()
    assert main(['resume', uri, 'fit.num_epochs=3']) == 0
    resumed, uninterrupted = _weights(storage, f'tiny/{cut}'), _weights(storage, f'tiny/{full}')
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)
    assert 'fit.num_epochs=3' in storage.read_text(f'tiny/{cut}/command_line.txt').splitlines()[-1]
    assert 'num_epochs: 3\n' in storage.read_text(f'tiny/{cut}/recipe.yaml')       # the recipe it continued with

    assert main(['resume', uri]) == 0
    assert 'finished: 3 epochs trained (fit.num_epochs=3)' in capsys.readouterr().out
