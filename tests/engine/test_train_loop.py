"""TrainLoop behaviour beyond the event order: models, data, predictions, history, host syncs."""
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from aitoolbox_like import (AbstractModelFeedDefinition, ModelWrap, MultiLoss, MultiOptimizer, TrainLoop,
                            TrainingHistory, TTModel)
from aitoolbox_like.callbacks.abstract import AbstractCallback
from helpers import MLP, PlainMLP, classification_data, loaders, state_equal


def sgd(model, lr=0.1):
    return torch.optim.SGD(model.parameters(), lr=lr)


def test_import_does_not_load_optional_heavy_packages():
    # torch's FSDP, DTensor and distributed checkpoint modules too: about a second of every process start (each
    # restart of an elastic run), needed only once something is sharded.
    code = ('import sys, aitoolbox_like, aitoolbox_like.train_loop, aitoolbox_like.callbacks.basic, '
            'aitoolbox_like.callbacks.model_save, aitoolbox_like.engine.launch; '
            'print(sorted(m for m in ("boto3", "tensorboard", "matplotlib", "torchvision", "sklearn", '
            '"torchmetrics", "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint") '
            'if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == '[]'


def test_plain_module_gets_a_type_error_that_says_what_to_do():
    model = PlainMLP()
    train, val, test = loaders()
    # constructed freely (a callback may compute its loss: Orca's MainCallback); fit and evaluation say what to do
    loop = TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match='subclass aitoolbox_like.TTModel.*ModelWrap.*MainCallback'):
        loop.fit(num_epochs=1)
    with pytest.raises(TypeError, match='subclass aitoolbox_like.TTModel.*ModelWrap'):
        loop.evaluate_loss_on_validation_set()
    with pytest.raises(TypeError, match='must be a TTModel'):
        TrainLoop('not a model', train, val, test, sgd(model), nn.CrossEntropyLoss())


def test_bad_arguments_are_clear_errors():
    model = MLP()
    train, val, test = loaders()
    # Construction accepts anything AIToolbox code passes; fit refuses it before a batch is trained.
    with pytest.raises(TypeError, match='optimizer .* has no step'):
        TrainLoop(model, train, val, test, object(), nn.CrossEntropyLoss()).fit(num_epochs=1)
    with pytest.raises(TypeError, match=r'optimizer is the class SGD.*pass an instance'):
        TrainLoop(model, train, val, test, torch.optim.SGD, nn.CrossEntropyLoss()).fit(num_epochs=1)
    with pytest.raises(ValueError, match='gpu_mode must be one of'):
        TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss(), gpu_mode='dpp')
    tl = TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match='exactly one of num_epochs and num_iterations'):
        tl.fit(num_epochs=1, num_iterations=3)
    with pytest.raises(ValueError, match='exactly one'):
        tl.fit()
    with pytest.raises(TypeError, match="only accepted with gpu_mode='ddp'"):
        tl.fit(num_epochs=1, num_gpus=2)
    with pytest.raises(TypeError, match=r'in_process_data_load must be a callback .* got object'):
        TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss(), gpu_mode='ddp').fit(
            num_epochs=1, in_process_data_load=object())
    with pytest.raises(ValueError, match='no test loader'):
        TrainLoop(model, train, None, None, sgd(model), nn.CrossEntropyLoss()).predict_on_test_set()


def test_data_parallel_mode_trains_like_single_mode_and_returns_the_wrapper():
    weights = []
    for gpu_mode in ('single', 'dp'):
        torch.manual_seed(5)
        model = MLP()
        train, val, test = loaders(shuffle=False)
        loop = TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss(), gpu_mode=gpu_mode)
        trained = loop.fit(num_epochs=2)
        # as in AIToolbox, 'dp' gives back the DataParallel wrapper of the model
        assert trained is (model if gpu_mode == 'single' else loop.model) and getattr(trained, 'module', model) is model
        weights.append(model.state_dict())
    assert state_equal(*weights)


def test_model_wrap_trains_a_plain_module_like_a_tt_model():
    class Feed(AbstractModelFeedDefinition):
        def get_loss(self, model, batch_data, criterion, device):
            x, y = batch_data
            return criterion(model(x.to(device)), y.to(device))

        def get_predictions(self, model, batch_data, device):
            x, y = batch_data
            return model(x.to(device)), y, {'row_sum': x.sum(dim=1)}

    torch.manual_seed(0)
    plain = PlainMLP()
    torch.manual_seed(0)
    basic = MLP()
    train, val, test = loaders(shuffle=False)
    tl_plain = TrainLoop(ModelWrap(plain, Feed()), train, val, test, sgd(plain), nn.CrossEntropyLoss())
    tl_plain.fit(num_epochs=2)
    TrainLoop(basic, train, val, test, sgd(basic), nn.CrossEntropyLoss()).fit(num_epochs=2)
    assert tl_plain.model is plain
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), basic.parameters()))
    y_pred, y_true, metadata = tl_plain.predict_on_validation_set()
    assert y_pred.shape == (29, 3) and metadata['row_sum'].shape == (29,)


class TwoHeads(TTModel):
    """A model with two losses and two optimizers (one per head)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head_a = nn.Linear(8, 3)
        self.head_b = nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.head_a(h), self.head_b(h).squeeze(1)

    def get_loss(self, batch_data, criterion, device):
        x, y = batch_data
        a, b = self(x)
        return MultiLoss({'cls': criterion(a, y), 'reg': nn.functional.mse_loss(b, y.float())})

    def get_predictions(self, batch_data, device):
        x, y = batch_data
        return self(x)[0], y, None


def test_multi_loss_and_multi_optimizer_match_manual_steps():
    torch.manual_seed(0)
    ref, model = TwoHeads(), TwoHeads()
    model.load_state_dict(ref.state_dict())

    def optimizers(m):
        return [torch.optim.SGD(list(m.body.parameters()) + list(m.head_a.parameters()), lr=0.1),
                torch.optim.SGD(m.head_b.parameters(), lr=0.05)]
    ref_opts = optimizers(ref)
    train, val, _ = loaders(shuffle=False)
    for x, y in train:
        a, b = ref(x)
        nn.functional.cross_entropy(a, y).backward(retain_graph=True)
        nn.functional.mse_loss(b, y.float()).backward()
        for opt in ref_opts:
            opt.step()
            opt.zero_grad()

    steps = []

    class StepLog(AbstractCallback):
        def __init__(self):
            super().__init__('steps')

        def on_after_gradient_update(self, optimizer_idx):
            steps.append(('grad', optimizer_idx, self.train_loop_obj.optimizer_idx))

        def on_after_optimizer_step(self):
            steps.append(('step', self.train_loop_obj.optimizer_idx))

    tl = TrainLoop(model, train, val, None, MultiOptimizer(optimizers(model)), nn.CrossEntropyLoss())
    tl.fit(num_epochs=1, callbacks=[StepLog()])
    assert state_equal(ref.state_dict(), model.state_dict())
    assert steps[:4] == [('grad', 0, 0), ('step', 0), ('grad', 1, 1), ('step', 1)]
    history = tl.train_history
    assert len(history['val_loss_cls']) == len(history['val_loss_reg']) == 1
    assert history['val_loss'][0] == pytest.approx(history['val_loss_cls'][0] + history['val_loss_reg'][0])
    assert isinstance(tl.evaluate_loss_on_validation_set(), MultiLoss)
    assert set(tl.evaluate_loss_on_validation_set(float_dict_format=True)) == {'cls', 'reg'}


class Stream(IterableDataset):
    def __init__(self, n):
        self.data = classification_data(n)

    def __iter__(self):
        return iter(self.data)


def test_iterable_dataset_without_len_works_with_num_iterations():
    torch.manual_seed(0)
    model = MLP()
    train = DataLoader(Stream(20), batch_size=8)      # 3 batches per pass, no len()
    with pytest.raises(TypeError):
        len(train)
    tl = TrainLoop(model, train, None, None, sgd(model), nn.CrossEntropyLoss(), end_auto_eval=False)
    updates = []

    class Count(AbstractCallback):
        def __init__(self):
            super().__init__('count')

        def on_after_optimizer_step(self):
            updates.append((self.train_loop_obj.epoch, self.train_loop_obj.iteration))

    tl.fit(num_iterations=7, grad_accumulation=2, callbacks=[Count()])
    assert tl.total_iteration_idx == 6
    # Each pass has 3 batches; its last partial window is applied; the run ends after batch 0 of pass 3.
    assert updates == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 0)]
    assert tl.get_num_optimizer_updates() == 4     # without len() only an estimate: ceil(7 / 2)
    assert tl.get_num_training_steps() == 3        # AIToolbox's count: 7 // 2


def test_predictions_are_cached_per_position_and_callers_get_copies():
    calls = []
    model = MLP()
    original = model.get_predictions

    def counting_get_predictions(batch, device):
        calls.append(1)
        return original(batch, device)
    model.get_predictions = counting_get_predictions
    train, val, test = loaders()
    tl = TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss())
    first = tl.predict_on_validation_set()
    n_calls = len(calls)
    first[0].zero_()
    second = tl.predict_on_validation_set()
    assert len(calls) == n_calls                       # served from the cache
    assert not torch.equal(first[0], second[0])        # the mutation did not leak
    tl.predict_on_validation_set(force_prediction=True)
    assert len(calls) == 2 * n_calls
    tl.fit(num_epochs=1)                               # training moves the position: recomputed
    calls.clear()
    tl.predict_on_validation_set()
    assert calls


def test_after_batch_prediction_hook_runs_when_asked():
    seen = []

    class Seen(AbstractCallback):
        def __init__(self):
            super().__init__('seen')

        def on_after_batch_prediction(self, y_pred_batch, y_test_batch, metadata_batch, dataset_info):
            seen.append((dataset_info['type'], y_pred_batch.shape[0]))

    model = MLP()
    train, val, test = loaders(batch_size=16)
    tl = TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss())
    tl.callbacks_handler.register_callbacks([Seen()])
    tl.predict_on_validation_set()
    assert seen == []
    tl.predict_on_test_set(execute_callbacks=True)
    assert seen == [('test', 16), ('test', 1)]


def test_no_host_sync_per_training_step():
    """Reading a tensor's value on the host (.item(), float(), bool(), .tolist(), .cpu(), .numpy()) stalls a GPU;
    the count of such calls during fit must not grow with the number of steps."""
    names = ('item', '__float__', '__bool__', '__int__', 'tolist', 'cpu', 'numpy', '__index__')
    counts = {}

    def count_syncs(n_samples):
        counts.clear()
        originals = {name: getattr(torch.Tensor, name) for name in names}

        def wrap(name):
            def wrapper(*args, **kwargs):
                counts[name] = counts.get(name, 0) + 1
                return originals[name](*args, **kwargs)
            return wrapper
        torch.manual_seed(0)
        model = MLP()
        train, val, _ = loaders(n=n_samples, batch_size=4)
        tl = TrainLoop(model, train, val, None, sgd(model), nn.CrossEntropyLoss(), progress_bar=False)
        for name in names:
            setattr(torch.Tensor, name, wrap(name))
        try:
            tl.fit(num_epochs=2, grad_accumulation=2)
        finally:
            for name, fn in originals.items():
                setattr(torch.Tensor, name, fn)
        return sum(counts.values()), dict(counts)

    few, few_detail = count_syncs(16)      # 4 steps per epoch
    many, many_detail = count_syncs(160)   # 40 steps per epoch
    # What remains is per epoch: history values, evaluation results, DataLoader/sampler seeding.
    assert few == many, (few_detail, many_detail)


def test_training_history_behaves_like_a_dict_of_lists():
    history = TrainingHistory()
    assert list(history.keys()) == ['loss', 'accumulated_loss', 'val_loss']
    history.current_epoch = 0
    history['val_acc'] = 0.5                 # AIToolbox semantics: assignment appends
    history.current_epoch = 2
    history.insert_single_result_into_history('val_acc', 0.7)
    history.insert_single_result_into_history('f1', {'macro': 0.4, 'micro': 0.6})
    assert history['val_acc'] == [0.5, 0.7] and history.get_epochs('val_acc') == [0, 2]
    assert history.value_in_epoch('val_acc', 2) == 0.7
    assert history.value_in_epoch('val_acc', 3) is None and history.value_in_epoch('missing', 2) is None
    assert 'f1' in history and len(history) == 5
    flat = history.get_train_history_dict(flatten_dict=True)
    assert flat['f1_macro'] == [0.4] and flat['f1_micro'] == [0.6] and 'f1' not in flat
    assert history.get_epoch_from_history(2) == {'val_acc': 0.7, 'f1': {'macro': 0.4, 'micro': 0.6}}
    restored = TrainingHistory()
    restored.load_state_dict(history.state_dict())
    assert restored.get_train_history() == history.get_train_history()
    assert restored.get_epochs('val_acc') == [0, 2]


def test_progress_bar_shows_metrics(capsys):
    model = MLP()
    train, val, test = loaders()
    TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss(), progress_bar=True).fit(num_epochs=1)
    err = capsys.readouterr().err
    assert 'Epoch 1/1' in err and 'val_loss=' in err and '7/7' in err


def test_print_callbacks_lists_registered_callbacks(capsys):
    class Named(AbstractCallback):
        def __init__(self):
            super().__init__('the named one', execution_order=3)

    model = MLP()
    train, val, test = loaders()
    TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss(), print_callbacks=True).fit(
        num_epochs=1, callbacks=[Named()])
    assert 'the named one' in capsys.readouterr().out


def test_second_fit_with_num_iterations_continues_to_the_total():
    model = MLP()
    train, val, _ = loaders(shuffle=False)          # 7 batches per epoch
    tl = TrainLoop(model, train, val, None, sgd(model), nn.CrossEntropyLoss())
    tl.fit(num_iterations=10)
    tl.fit(num_iterations=20)
    assert tl.total_iteration_idx == 19


def test_empty_loader_with_num_iterations_is_an_error_not_a_hang():
    model = MLP()
    empty = DataLoader(classification_data(0), batch_size=4)
    tl = TrainLoop(model, empty, None, None, sgd(model), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match='yielded no batches'):
        tl.fit(num_iterations=5)


# ---- wrong usages a new user makes: a clear error before (or at) the first step, naming the fix

def test_a_tensor_passed_as_train_loader_is_named_before_the_first_step():
    model = MLP()
    x = torch.randn(16, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loop = TrainLoop(model, x, None, None, sgd(model), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match=r'train_loader is a torch.Tensor of shape \(16, 4\).*'
                                        r'DataLoader\(TensorDataset\(x, y\)'):
        loop.fit(num_epochs=1)
    assert state_equal(before, model.state_dict())


def test_get_loss_returning_none_names_the_method_and_the_fix():
    class ForgotReturn(MLP):
        def get_loss(self, batch_data, criterion, device):
            x, y = batch_data
            criterion(self(x), y)           # the return statement is missing

    model = ForgotReturn()
    train, val, test = loaders()
    with pytest.raises(TypeError, match=r'ForgotReturn.get_loss returned None.*return statement'):
        TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss()).fit(num_epochs=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason='float16 AMP is available on this machine')
def test_explicit_fp16_without_cuda_is_refused_by_fit_while_aitoolbox_s_true_falls_back(recwarn):
    model = MLP()
    train, val, test = loaders()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    loop = TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss(), use_amp='fp16')   # constructs
    with pytest.raises(ValueError, match=r"use_amp='fp16'.*needs a CUDA device.*use_amp='bf16'"):
        loop.fit(num_epochs=1)
    assert state_equal(before, model.state_dict())
    # AIToolbox's use_amp=True: warns once and trains in full precision.
    with pytest.warns(UserWarning, match='training in full precision'):
        fallback = TrainLoop(model, train, val, test, sgd(model), nn.CrossEntropyLoss(), use_amp=True)
    fallback.fit(num_epochs=1)
    assert not state_equal(before, model.state_dict())
