"""One of several runs started at once with the same project, experiment and timestamp (the cloud claim test).

python claim_script.py LOCAL_FOLDER CLOUD_SAVE_MODE BUCKET TIMESTAMP READY_FILE GO_FILE RESULT_FILE
Each process has its own local folder; all upload to one bucket (the environment names the server).
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

from aitoolbox_like.experiment import ExperimentUploader  # noqa: E402
from aitoolbox_like.tracking import TrainLoopCheckpoint  # noqa: E402
from saving_helpers import make_parts  # noqa: E402


def main():
    folder, mode, bucket, timestamp, ready, go, result = sys.argv[1:8]
    ExperimentUploader.storage_options = {'max_attempts': 3}
    model, train, val, test, optimizer = make_parts(seed=0)
    loop = TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'exp',
                               folder, {'lr': 1e-2, 'who': folder}, cloud_save_mode=mode, bucket_name=bucket,
                               cloud_dir_prefix='shared', progress_bar=False)
    loop.experiment_timestamp = timestamp         # as if all three started in the same second
    open(ready, 'w').close()
    while not os.path.exists(go):                 # start together
        time.sleep(0.005)
    loop.fit(num_epochs=1)
    with open(result, 'w') as f:
        json.dump({'timestamp': loop.experiment_timestamp, 'dir': loop.experiment.dir_path,
                   'run_id': loop.experiment.run_id, 'failures': len(loop.upload_failures)}, f)


if __name__ == '__main__':
    main()
