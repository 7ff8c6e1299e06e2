"""Preemption-safe saving: a real training process gets SIGTERM / SIGINT, checkpoints mid-epoch and exits cleanly;
a new process resumes with fit(resume_from='latest') and ends with the weights of the uninterrupted run, bit for
bit. Also Timer(max_duration_s), the default registration and the opt-out, handler restoration, on_exception."""
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SAVING = os.path.join(os.path.dirname(HERE), 'saving')
if SAVING not in sys.path:
    sys.path.insert(0, SAVING)

from aitoolbox_like import AbstractCallback, TrainLoop  # noqa: E402
from aitoolbox_like.callbacks.basic import EarlyStopping, Timer  # noqa: E402
from aitoolbox_like.callbacks.model_save import ModelCheckpoint  # noqa: E402
from aitoolbox_like.callbacks.preemption import (PreemptionCheckpoint, find_preemption_callback,  # noqa: E402
                                                 next_agreement_stride)
from aitoolbox_like.callbacks.train_schedule import StepLRScheduler  # noqa: E402
from aitoolbox_like.checkpoint import load_checkpoint  # noqa: E402
from aitoolbox_like.experiment import bookkeeping_dir  # noqa: E402
from aitoolbox_like.tracking import TrainLoopCheckpoint, TrainLoopCheckpointEndSave  # noqa: E402
from aitoolbox_like.results import ClassificationResultPackage  # noqa: E402
from saving_helpers import assert_same_weights, make_parts, weights  # noqa: E402
from fresh_process import FreshProcess  # noqa: E402

SCRIPT = os.path.join(SAVING, 'preempt_script.py')


# ---------------------------------------------------------------------------------------------- a real process


def _start(warm, out_dir, result, *args):
    return warm.start_here([SCRIPT, out_dir, result, *args], f'{result}.log')


def _run(warm_python, out_dir, result, *args):
    process = _start(warm_python, out_dir, result, *args)
    assert warm_python.wait(process, timeout=180) == 0, process.output()[1][-3000:]
    return torch.load(result, weights_only=True)


def _signal_at_batch(warm_python, out_dir, result, batch_idx, signum, *args):
    """Start the script, wait until it reports batch ``batch_idx`` done, send ``signum``; returns the process (its
    ``returncode`` set) and what it wrote to stderr."""
    marker = str(result) + '.marker'
    process = _start(warm_python, out_dir, result, '--wait-at-batch', batch_idx, *args)
    deadline = time.monotonic() + 120
    try:
        while not os.path.exists(marker) and warm_python.running(process) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(marker), f'the run never reached batch {batch_idx}: {process.output()[1][-3000:]}'
        os.kill(process.pid, signum)
    finally:
        warm_python.wait(process, timeout=120)         # kills a run still going after that
    return process, process.output()[1]


def _signal_fresh_at_batch(out_dir, result, batch_idx, signum, *args):
    """As _signal_at_batch, with the script started as a user starts it (``python preempt_script.py``, a fresh
    interpreter, no hash seed forced, a process group of its own as a terminal's job); SIGINT goes to the group, as
    the terminal's Ctrl-C, another signal to the process, as a scheduler's."""
    marker = str(result) + '.marker'
    with FreshProcess([sys.executable, SCRIPT, out_dir, result, '--wait-at-batch', batch_idx, *args], os.getcwd(),
                      os.environ, f'{result}.log') as process:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker) and process.running() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(marker), f'the run never reached batch {batch_idx}: {process.output()[1][-3000:]}'
        if signum == signal.SIGINT:
            process.ctrl_c()
        else:
            process.send(signum)
        process.wait(timeout=120)                      # kills a run still going after that
    return process, process.output()[1]


@pytest.fixture(scope='module')
def reference(tmp_path_factory, warm_python):
    tmp = tmp_path_factory.mktemp('reference')
    return _run(warm_python, tmp / 'out', tmp / 'result.pt', '--epochs', 3)


def _experiment(out_dir):
    return next((out_dir / 'proj').iterdir())


def _pointer(experiment):
    """The experiment's latest_checkpoint.txt, in its bookkeeping folder (outside the experiment folder)."""
    return Path(bookkeeping_dir(experiment)) / 'latest_checkpoint.txt'


def test_sigterm_checkpoints_mid_epoch_exits_cleanly_and_resumes_bit_exactly(tmp_path, reference, warm_python):
    out = tmp_path / 'out'
    # 7 batches an epoch
    process, stderr = _signal_at_batch(warm_python, out, tmp_path / 'stopped.pt', 10, signal.SIGTERM)
    assert process.returncode == 0, stderr[-3000:]
    assert 'received SIGTERM' in stderr

    stopped = torch.load(tmp_path / 'stopped.pt', weights_only=True)
    assert stopped['stop_reason'] == 'received SIGTERM'
    # The script can tell that fit returned before the end; the end-of-training evaluation waits for the real end.
    assert stopped['interrupted'] == 'received SIGTERM'
    assert 'train_end_test_loss' not in stopped['history_names']
    assert stopped['total_iteration_idx'] == 10             # the step in progress was finished, no further one
    experiment = _experiment(out)
    latest = _pointer(experiment).read_text()
    assert latest.endswith('_E1_ITER10.pth')
    assert stopped['checkpoint_path'].endswith(latest.split('/')[-1])
    checkpoint = load_checkpoint(experiment / latest)
    assert checkpoint['data_position']['batches_done'] == 4          # batches 7..10 of epoch 1

    resumed = _run(warm_python, out, tmp_path / 'resumed.pt', '--epochs', 3, '--resume')
    assert_same_weights(resumed['weights'], reference['weights'])
    assert resumed['history']['train_history'] == reference['history']['train_history']
    assert resumed['experiment_timestamp'] == experiment.name[len('run_'):]
    assert resumed['stop_reason'] is None and resumed['interrupted'] is None
    assert 'train_end_test_loss' in resumed['history_names']


def test_sigint_works_the_same_and_exit_code_signal_reports_143_for_sigterm(tmp_path, reference, warm_python):
    # Both runs started cold, as a user's shell starts them (the others here fork from the tests' zygote).
    process, stderr = _signal_fresh_at_batch(tmp_path / 'a', tmp_path / 'a.pt', 3, signal.SIGINT)
    assert process.returncode == 0, stderr[-3000:]
    assert _pointer(_experiment(tmp_path / 'a')).read_text().endswith('_E0_ITER3.pth')
    assert 'KeyboardInterrupt' not in stderr

    process, stderr = _signal_fresh_at_batch(tmp_path / 'b', tmp_path / 'b.pt', 5, signal.SIGTERM,
                                             '--exit-code', 'signal')
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert _pointer(_experiment(tmp_path / 'b')).read_text().endswith('_E0_ITER5.pth')
    resumed = _run(warm_python, tmp_path / 'b', tmp_path / 'b_resumed.pt', '--epochs', 3, '--resume')
    assert_same_weights(resumed['weights'], reference['weights'])


# ---------------------------------------------------------------------------------------------- every phase


def _signal_in_phase(warm_python, out_dir, result, phase, signum=signal.SIGTERM, delay_s=0.3):
    """Start the script with ``--slow-phase phase``, wait until the phase begins, ``delay_s`` more, send ``signum``;
    returns the process (its ``returncode`` set) and what it wrote to stderr."""
    marker = str(result) + '.phase'
    process = _start(warm_python, out_dir, result, '--slow-phase', phase)
    deadline = time.monotonic() + 120
    try:
        while not os.path.exists(marker) and warm_python.running(process) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(marker), f'the run never reached its {phase}: {process.output()[1][-3000:]}'
        time.sleep(delay_s)
        os.kill(process.pid, signum)
    finally:
        # Far less than the phase left (a validation pass of 8 s, waits of 60 s): a stop that waited for its end
        # is killed here and fails below.
        warm_python.wait(process, timeout=20)
    return process, process.output()[1]


def _resumes_like_the_uninterrupted_run(warm_python, out, tmp_path, reference, *args):
    resumed = _run(warm_python, out, tmp_path / 'resumed.pt', '--epochs', 3, '--resume', *args)
    assert_same_weights(resumed['weights'], reference['weights'])
    assert resumed['history']['train_history'] == reference['history']['train_history']
    assert resumed['interrupted'] is None


def test_sigterm_1s_into_a_validation_pass_abandons_it_and_the_resume_evaluates_it_again(tmp_path, reference,
                                                                                         warm_python):
    """The validation pass of epoch 1 takes 8 s (3 batches of 2.7 s); SIGTERM 1 s into it. The pass is abandoned
    (no batch of it evaluated, nothing of it in the history), the checkpoint is the one after the epoch's last batch,
    and the resumed run evaluates the pass again: weights and history equal the uninterrupted run's."""
    out = tmp_path / 'out'
    process, stderr = _signal_in_phase(warm_python, out, tmp_path / 'stopped.pt', 'validation', delay_s=1.0)
    assert process.returncode == 0, stderr[-3000:]
    stopped = torch.load(tmp_path / 'stopped.pt', weights_only=True)
    assert stopped['stop_reason'] == 'received SIGTERM' and stopped['interrupted'] == 'received SIGTERM'
    assert stopped['eval_passes'][-1] == [1, 'validation', 0]          # abandoned in its first batch
    assert len(stopped['history']['train_history']['val_loss']) == 1  # epoch 0's only
    assert stopped['total_iteration_idx'] == 13                        # the last batch of epoch 1 (7 an epoch)
    assert _pointer(_experiment(out)).read_text().endswith('_E1_ITER13.pth')
    assert stopped['stop_latency_s'] is not None and 'the evaluation was abandoned' in stderr
    assert 'the checkpoint is durable' in stderr
    _resumes_like_the_uninterrupted_run(warm_python, out, tmp_path, reference)


def test_sigterm_while_the_loader_waits_for_a_batch_abandons_the_wait(tmp_path, reference, warm_python):
    """The train loader's read of batch 9 stalls for 60 s; SIGTERM during it: the checkpoint is the one after batch
    8, and the resumed run reads batch 9 again."""
    out = tmp_path / 'out'
    process, stderr = _signal_in_phase(warm_python, out, tmp_path / 'stopped.pt', 'loader')
    assert process.returncode == 0, stderr[-3000:]
    stopped = torch.load(tmp_path / 'stopped.pt', weights_only=True)
    assert stopped['total_iteration_idx'] == 8 and 'the fetch was abandoned' in stderr
    latest = _pointer(_experiment(out)).read_text()
    assert latest.endswith('_E1_ITER8.pth')
    assert load_checkpoint(_experiment(out) / latest)['data_position']['batches_done'] == 2
    _resumes_like_the_uninterrupted_run(warm_python, out, tmp_path, reference)


def test_sigint_during_torch_compiles_warm_up_abandons_the_first_step(tmp_path, reference, warm_python):
    """A compile backend that takes 60 s in the first step; Ctrl-C's SIGINT during it: the step is abandoned (the
    checkpoint holds the state before it, random-number states included), and the resumed run, compiled again,
    trains like the uninterrupted eager run."""
    out = tmp_path / 'out'
    process, stderr = _signal_in_phase(warm_python, out, tmp_path / 'stopped.pt', 'compile', signal.SIGINT)
    assert process.returncode == 0, stderr[-3000:]
    stopped = torch.load(tmp_path / 'stopped.pt', weights_only=True)
    assert stopped['total_iteration_idx'] == -1 and stopped['stop_reason'] == 'received SIGINT'
    assert 'the compile was abandoned' in stderr
    _resumes_like_the_uninterrupted_run(warm_python, out, tmp_path, reference, '--slow-phase', 'compile')


# ---------------------------------------------------------------------------------------------- in process


def _loop(root, seed=0, **kwargs):
    model, train, val, test, optimizer = make_parts(seed=seed)
    return TrainLoopCheckpoint(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'proj', 'run',
                               str(root), {'lr': 1e-2}, cloud_save_mode='local', progress_bar=False, **kwargs)


def _callbacks():
    return [StepLRScheduler(step_size=1, gamma=0.7), EarlyStopping(patience=50)]


class SignalSelfAt(AbstractCallback):
    """Sends a signal to this process at the end of batch T (the handler runs in this main thread)."""

    def __init__(self, batch_idx, signum=signal.SIGTERM):
        super().__init__('signal self', execution_order=0)
        self.batch_idx, self.signum = batch_idx, signum

    def on_batch_end(self):
        if self.train_loop_obj.total_iteration_idx == self.batch_idx:
            os.kill(os.getpid(), self.signum)


@pytest.fixture(scope='module')
def in_process_reference(tmp_path_factory):
    loop = _loop(tmp_path_factory.mktemp('ref') / 'results')
    loop.fit(num_epochs=3, callbacks=_callbacks())
    return weights(loop.model), loop.train_history.train_history


@pytest.mark.parametrize('batch_idx', [6, 13])      # the last batch of epoch 0, of epoch 1
def test_a_signal_at_the_last_batch_of_an_epoch_resumes_bit_exactly(tmp_path, in_process_reference, batch_idx):
    first = _loop(tmp_path / 'results')
    first.fit(num_epochs=3, callbacks=_callbacks() + [SignalSelfAt(batch_idx)])
    assert first.total_iteration_idx == batch_idx
    resumed = _loop(tmp_path / 'results', seed=9)
    resumed.fit(num_epochs=3, callbacks=_callbacks(), resume_from='latest')
    assert_same_weights(weights(resumed.model), in_process_reference[0])
    assert resumed.train_history.train_history == in_process_reference[1]


def test_inside_a_gradient_accumulation_window(tmp_path):
    reference = _loop(tmp_path / 'ref')
    reference.fit(num_epochs=2, callbacks=_callbacks(), grad_accumulation=3)
    first = _loop(tmp_path / 'results')
    first.fit(num_epochs=2, callbacks=_callbacks() + [SignalSelfAt(4)], grad_accumulation=3)
    resumed = _loop(tmp_path / 'results', seed=3)
    resumed.fit(num_epochs=2, callbacks=_callbacks(), grad_accumulation=3, resume_from='latest')
    assert_same_weights(weights(resumed.model), weights(reference.model))


def test_handlers_are_installed_only_during_fit_and_restored(tmp_path):
    seen = {}

    class Look(AbstractCallback):
        def __init__(self):
            super().__init__('look')

        def on_epoch_begin(self):
            seen['during'] = signal.getsignal(signal.SIGTERM)

    before_term, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    loop = _loop(tmp_path / 'results')
    loop.fit(num_epochs=1, callbacks=[Look()])
    preemption = find_preemption_callback(loop)
    assert preemption is not None                          # added by default with a checkpoint callback
    assert seen['during'] == preemption._handle_signal
    assert signal.getsignal(signal.SIGTERM) == before_term and signal.getsignal(signal.SIGINT) == before_int
    assert preemption.stop_reason is None

    class Boom(AbstractCallback):
        def __init__(self):
            super().__init__('boom')

        def on_batch_end(self):
            raise RuntimeError('boom')

    with pytest.raises(RuntimeError):
        _loop(tmp_path / 'other').fit(num_epochs=1, callbacks=[Boom()])
    assert signal.getsignal(signal.SIGTERM) == before_term and signal.getsignal(signal.SIGINT) == before_int


def test_default_only_with_a_checkpoint_callback_and_the_opt_out(tmp_path):
    assert find_preemption_callback(_fit_plain(tmp_path)) is None
    loop = _loop(tmp_path / 'off', preemption_safe=False)
    loop.fit(num_epochs=1)
    assert find_preemption_callback(loop) is None
    model, train, val, test, optimizer = make_parts()
    end_save = TrainLoopCheckpointEndSave(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'p', 'e',
                                          str(tmp_path / 'es'), {}, val_result_package=ClassificationResultPackage(),
                                          cloud_save_mode='local', progress_bar=False)
    end_save.fit(num_epochs=1)
    assert find_preemption_callback(end_save) is not None
    # A plain TrainLoop with a ModelCheckpoint gets it too; one registered by the user is not doubled.
    model, train, val, test, optimizer = make_parts()
    plain = TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)
    mine = PreemptionCheckpoint(signals=(signal.SIGTERM,))
    plain.fit(num_epochs=1, callbacks=[ModelCheckpoint('p', 'e', str(tmp_path / 'pl'), {}, cloud_save_mode='local'),
                                       mine])
    assert [cb for cb in plain.callbacks if isinstance(cb, PreemptionCheckpoint)] == [mine]


def _fit_plain(tmp_path):
    model, train, val, test, optimizer = make_parts()
    loop = TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)
    loop.fit(num_epochs=1)
    return loop


def test_without_a_checkpoint_callback_a_stop_request_still_stops_cleanly(tmp_path, caplog):
    model, train, val, test, optimizer = make_parts()
    loop = TrainLoop(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), progress_bar=False)
    preemption = PreemptionCheckpoint()
    loop.fit(num_epochs=2, callbacks=[preemption, SignalSelfAt(2)])
    assert loop.total_iteration_idx == 2
    assert preemption.stop_reason == 'received SIGTERM' and preemption.checkpoint_path is None
    assert 'no checkpoint callback' in caplog.text


# ---------------------------------------------------------------------------------------------- DDP


@pytest.mark.timeout(300)
def test_ddp_every_rank_stops_at_the_same_step_rank0_saves_and_the_resume_continues(tmp_path, monkeypatch):
    """A stop asked on rank 1 only: both ranks stop after the same batch (the next agreement step), rank 0 writes
    the mid-epoch checkpoint, and a DDP resume ends where the uninterrupted DDP run ends."""
    from torch import nn
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'distributed', 'ddp_scripts'))
    from ddp_common import equivalence_setup
    from preempt_script import RecordLastBatch, RequestStopOnRank
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    ddp = dict(num_gpus=2, on_gpu=False)

    def tracked_loop(folder):
        model, train, val, optimizer = equivalence_setup()      # 4 batches per rank and epoch
        return TrainLoopCheckpoint(model, train, val, None, optimizer, nn.MSELoss(), 'proj', 'exp', str(folder),
                                   {'lr': 0.05}, cloud_save_mode='local', gpu_mode='ddp', progress_bar=False)

    uninterrupted = tracked_loop(tmp_path / 'full')
    uninterrupted.fit(num_epochs=6, **ddp)

    first = tracked_loop(tmp_path / 'run')
    # ddp_sync_every caps the steps between two agreements (and stop_within_s this long leaves the cap to decide):
    # agreements after batches 0, 1, 3, 7, 11, 15, 19, ... The stop asked after batch 17 is agreed on at 19.
    first.fit(num_epochs=6, callbacks=[PreemptionCheckpoint(ddp_sync_every=4, stop_within_s=3600),
                                       RequestStopOnRank(1, 17), RecordLastBatch(str(tmp_path))], **ddp)
    assert (tmp_path / 'last_batch_rank0').read_text() == (tmp_path / 'last_batch_rank1').read_text() == '19'
    experiment = _experiment(tmp_path / 'run')
    assert _pointer(experiment).read_text().endswith('_E4_ITER19.pth')

    resumed = tracked_loop(tmp_path / 'run')
    resumed.fit(num_epochs=6, resume_from='latest', **ddp)
    for key, value in uninterrupted.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def test_the_steps_between_two_agreements_fit_the_steps_in_stop_within_s():
    """Fast steps: many steps per agreement (doubling up to what fits in stop_within_s); steps longer than
    stop_within_s: an agreement after every step; ddp_sync_every caps the steps; a slow-down shortens at once."""
    def strides(step_s, agreements, within_s=1.0, most=None, stride=1):
        seen = []
        for _ in range(agreements):
            stride = next_agreement_stride(stride, step_s, within_s, most)
            seen.append(stride)
        return seen

    assert next_agreement_stride(1, 0.0, 1.0) == 1                  # the first agreement: nothing measured yet
    assert strides(0.001, 12) == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000, 1000]
    assert strides(0.3, 3) == [2, 3, 3] and strides(2.5, 3) == [1, 1, 1] and strides(5.0, 3, stride=1000) == [1] * 3
    assert strides(0.001, 6, most=10) == [2, 4, 8, 10, 10, 10]      # ddp_sync_every: at most that many steps
    assert strides(0.001, 2, within_s=0.01) == [2, 4] and strides(0.001, 3, within_s=0.01, stride=8) == [10] * 3
    assert next_agreement_stride(512, 0.4, 1.0) == 2


@pytest.mark.timeout(300)
def test_ddp_a_real_signal_to_one_rank_stops_both_at_the_same_agreement_step_whose_stride_follows_the_step_time(
        tmp_path, monkeypatch):
    """2 processes: 5 slow steps (0.3 s each, longer than half of stop_within_s=0.5: an agreement after every one),
    then fast steps (the steps between two agreements double). SIGTERM to rank 1 alone in batch 20: both ranks stop
    after the first agreement at or after it, having made the same agreements; rank 0 writes its checkpoint."""
    from torch import nn
    from torch.utils.data import DataLoader
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'distributed', 'ddp_scripts'))
    from ddp_common import Regressor, regression_data
    from stop_deadline_fit import RecordAgreements, SignalOnRank, SleepInSteps
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    torch.manual_seed(0)
    model = Regressor()
    # 40 batches per rank in the epoch: the agreement after batch 20 comes by batch 35 (1, 2, 4, 8, 16 steps apart).
    loop = TrainLoop(model, DataLoader(regression_data(320, 1), batch_size=4), None, None,
                     torch.optim.SGD(model.parameters(), lr=0.01), nn.MSELoss(), gpu_mode='ddp', progress_bar=False)
    loop.fit(num_epochs=1, num_gpus=2, on_gpu=False, callbacks=[
        ModelCheckpoint('proj', 'exp', str(tmp_path / 'out'), {}, cloud_save_mode='local', async_save=False),
        RecordAgreements(str(tmp_path), stop_within_s=0.5), SleepInSteps(range(5), 0.3), SignalOnRank(1, 20)])

    ranks = [json.loads((tmp_path / f'agreements_rank{r}.json').read_text()) for r in (0, 1)]
    assert ranks[0]['agreements'] == ranks[1]['agreements'], ranks     # the same steps, strides and answers
    agreements = ranks[0]['agreements']
    steps = [step for step, _, _ in agreements]
    assert steps[:5] == [0, 1, 2, 3, 4], agreements                      # slow steps: one agreement after each
    assert max(stride for _, stride, _ in agreements) >= 8, agreements   # fast steps: many steps per agreement
    stop = min(step for step in steps if step >= 20)
    assert [step for step, _, stopped in agreements if stopped] == [stop] == [steps[-1]], agreements
    assert ranks[0]['last'] == ranks[1]['last'] == stop
    assert ranks[1]['received_signal'] == signal.SIGTERM and ranks[1]['stop_reason'] == 'received SIGTERM'
    assert ranks[0]['stop_reason'] == 'another rank was asked to stop' and ranks[0]['received_signal'] is None
    assert ranks[0]['checkpoint_path'].endswith(f'_E0_ITER{stop}.pth')
    assert load_checkpoint(ranks[0]['checkpoint_path'])['data_position']['batches_done'] == stop + 1


# ---------------------------------------------------------------------------------------------- Timer budget


def test_timer_max_duration_stops_and_saves_then_resume_is_exact(tmp_path, in_process_reference):
    first = _loop(tmp_path / 'results')
    timer = Timer(max_duration_s=1e-9)
    first.fit(num_epochs=3, callbacks=_callbacks() + [timer])
    preemption = find_preemption_callback(first)
    assert 'time budget' in preemption.stop_reason
    assert first.total_iteration_idx == 0                 # stopped after the first step
    assert preemption.checkpoint_path.endswith('_E0_ITER0.pth') and os.path.isfile(preemption.checkpoint_path)
    resumed = _loop(tmp_path / 'results', seed=4)
    resumed.fit(num_epochs=3, callbacks=_callbacks() + [Timer()], resume_from='latest')
    assert_same_weights(weights(resumed.model), in_process_reference[0])


def test_timer_max_duration_without_a_registered_preemption_callback(tmp_path):
    loop = _loop(tmp_path / 'results', preemption_safe=False)
    loop.fit(num_epochs=2, callbacks=[Timer(max_duration_s=1e-9)])
    assert loop.total_iteration_idx == 0
    assert find_preemption_callback(loop) is None
    assert _pointer(_experiment(tmp_path / 'results')).read_text().endswith('_E0_ITER0.pth')


def test_timer_without_a_budget_never_stops(tmp_path):
    loop = _loop(tmp_path / 'results')
    loop.fit(num_epochs=1, callbacks=[Timer()])
    assert loop.epochs_completed == 1
    with pytest.raises(ValueError):
        Timer(max_duration_s=0)


# ---------------------------------------------------------------------------------------------- on_exception


class FailingLoader:
    """The train loader of make_parts, failing when its T-th batch is fetched (between two steps)."""

    def __init__(self, loader, fail_at):
        self.loader, self.fail_at, self.fetched = loader, fail_at, 0
        self.batch_size, self.dataset = loader.batch_size, loader.dataset

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            if self.fetched == self.fail_at:
                raise OSError('disk gone')
            self.fetched += 1
            yield batch


def test_on_exception_saves_when_the_data_loader_fails_between_steps(tmp_path):
    loop = _loop(tmp_path / 'results')
    loop.train_loader = FailingLoader(loop.train_loader, fail_at=3)
    preemption = PreemptionCheckpoint(on_exception=True)
    with pytest.raises(OSError):
        loop.fit(num_epochs=3, callbacks=[preemption])
    assert preemption.checkpoint_path.endswith('_E0_ITER2.pth')
    assert load_checkpoint(preemption.checkpoint_path)['data_position']['batches_done'] == 3


def test_on_exception_does_not_save_a_half_done_step(tmp_path):
    class FailInStep(AbstractCallback):
        def __init__(self):
            super().__init__('fail in step')

        def on_after_backward(self):
            if self.train_loop_obj.total_iteration_idx == 3:
                raise RuntimeError('inside the step')

    loop = _loop(tmp_path / 'results')
    preemption = PreemptionCheckpoint(on_exception=True)
    with pytest.raises(RuntimeError):
        loop.fit(num_epochs=1, callbacks=[preemption, FailInStep()])
    assert preemption.checkpoint_path is None
    assert not os.path.exists(_pointer(_experiment(tmp_path / 'results')))


def test_arguments_are_checked():
    for kwargs in ({'exit_code': 'yes'}, {'exit_code': True}, {'ddp_sync_every': 0}, {'ddp_sync_every': 2.5},
                   {'upload_wait_s': -1}, {'stop_within_s': 0}, {'stop_within_s': True}):
        with pytest.raises(ValueError):
            PreemptionCheckpoint(**kwargs)
    assert PreemptionCheckpoint(ddp_sync_every=10).ddp_sync_every == 10      # still accepted: now a cap
    assert 'on_batch_begin' not in PreemptionCheckpoint().hooks_in_use()       # one check per step only
    assert 'on_batch_begin' in PreemptionCheckpoint(on_exception=True).hooks_in_use()


def test_an_interrupted_fit_says_so_and_leaves_the_end_of_training_to_the_resumed_run(tmp_path):
    """After Ctrl-C the script can tell (loop.interrupted); no 'final' model, end-of-training evaluation or report is
    made of a half-trained run; the resumed run makes them at its end."""
    def end_save_loop(seed=0):
        model, train, val, test, optimizer = make_parts(seed=seed)
        return TrainLoopCheckpointEndSave(model, train, val, test, optimizer, torch.nn.CrossEntropyLoss(), 'p', 'e',
                                          str(tmp_path / 'es'), {}, val_result_package=ClassificationResultPackage(),
                                          cloud_save_mode='local', progress_bar=False)

    first = end_save_loop()
    first.fit(num_epochs=2, callbacks=[SignalSelfAt(3, signal.SIGINT)])
    assert first.interrupted == 'received SIGINT'
    assert first.total_iteration_idx == 3
    assert not [name for name in first.train_history if name.startswith('train_end_')]
    end_saver = next(cb for cb in first.callbacks if type(cb).__name__ == 'ModelTrainEndSave')
    experiment = Path(first.experiment.dir_path)
    assert end_saver.saved_files == [] and not (experiment / 'model').exists()

    resumed = end_save_loop(seed=5)
    resumed.fit(num_epochs=2, resume_from='latest')
    assert resumed.interrupted is None
    assert 'train_end_test_loss' in resumed.train_history
    assert Path(resumed.experiment.dir_path) == experiment and os.listdir(experiment / 'model')
