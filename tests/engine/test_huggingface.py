"""Hugging Face transformers models on the loop (docs/huggingface.md), against transformers' own Trainer.

Every test that imports transformers is in this module, and one worker runs them (its import costs seconds): the
module imports it on first use, not at collection, which every pytest worker does. The models are built from configs
with random weights: nothing is downloaded.
"""
import math

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from aitoolbox_like import TrainLoop, TTBasicModel
from aitoolbox_like.callbacks.abstract import AbstractCallback
from aitoolbox_like.callbacks.gradient import GradNormClip
from aitoolbox_like.callbacks.performance_eval import ModelPerformanceEvaluation
from aitoolbox_like.callbacks.train_schedule import (GeneralLRSchedulerCallback, LambdaLRScheduler,
                                                     LinearWithWarmupScheduler, LRSchedulerCallback)
from aitoolbox_like.model.huggingface import HFFeedDefinition, HFModelWrap, is_transformers_schedule
from aitoolbox_like.model import MultiGPUModelWrap
from aitoolbox_like.model.param_groups import decay_parameter_names, weight_decay_param_groups
from aitoolbox_like.results import ClassificationResultPackage

pytestmark = pytest.mark.xdist_group('transformers')

VOCAB, SEQ, CLASSES = 100, 8, 3
EPOCHS, BATCH, LR, WEIGHT_DECAY, WARMUP_RATIO = 3, 8, 1e-3, 0.01, 0.1
TRAIN, VAL = 40, 16         # 5 updates an epoch, 15 in all: ceil(0.1 x 15) = 2 warm-up updates


class TokenData(Dataset):
    """Random token sequences as a tokenizer would give them: dicts of input_ids, attention_mask and labels."""

    def __init__(self, n, seed, lm=False):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=generator)
        self.labels = self.ids if lm else torch.randint(0, CLASSES, (n,), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {'input_ids': self.ids[i], 'attention_mask': torch.ones(SEQ, dtype=torch.long),
                'labels': self.labels[i]}


def hf():
    """transformers, imported on first use."""
    import transformers
    return transformers


def tiny_bert(dropout=0.1):
    torch.manual_seed(0)
    return hf().BertForSequenceClassification(hf().BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=CLASSES, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout))


def tiny_gpt2():
    torch.manual_seed(0)
    return hf().GPT2LMHeadModel(hf().GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2))


def loader(data):
    return DataLoader(data, batch_size=BATCH)


# ---- the loop against transformers' Trainer, step by step ----------------------------------------------------------

@pytest.fixture(scope='module')
def hf_trainer_run(tmp_path_factory):
    """transformers' Trainer with its defaults (AdamW fused, weight decay off biases and LayerNorm weights, the linear
    schedule, max_grad_norm=1.0, seed 42) but for the settings named, evaluating accuracy every epoch: the loss of
    every step, the learning rates of every update, the metrics of every evaluation, the final weights.

    Without dropout: the Trainer's evaluation draws from the global random generator (every DataLoader iterator it
    starts takes a seed from it) and the loop's leaves the generator as it was, so with dropout the two would train
    on other random masks from the second epoch on (the first one's losses are equal to the bit with dropout too).
    The causal LM below keeps its dropout against a hand-written loop."""
    losses, lrs = [], []

    class UpdateLRs(hf().TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            torch_optimizer = getattr(optimizer, 'optimizer', optimizer)    # accelerate's wrapper holds it
            torch_optimizer.register_step_pre_hook(
                lambda opt, *_: lrs.append([group['lr'] for group in opt.param_groups]))

    class StepLosses(hf().Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            if model.training:
                losses.append(loss.detach().clone())
            return loss

    def accuracy(eval_prediction):
        logits, labels = eval_prediction
        return {'accuracy': float((logits.argmax(-1) == labels).mean())}

    args = hf().TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp('hf_trainer')), num_train_epochs=EPOCHS,
        per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH, learning_rate=LR,
        weight_decay=WEIGHT_DECAY, warmup_steps=WARMUP_RATIO, train_sampling_strategy='sequential',
        eval_strategy='epoch', save_strategy='no', logging_strategy='no', report_to='none', use_cpu=True,
        disable_tqdm=True)
    model = tiny_bert(dropout=0.)
    trainer = StepLosses(model=model, args=args, train_dataset=TokenData(TRAIN, 1), eval_dataset=TokenData(VAL, 2),
                         compute_metrics=accuracy, callbacks=[UpdateLRs()])
    trainer.train()
    evaluations = [entry for entry in trainer.state.log_history if 'eval_loss' in entry]
    names = {id(p): name for name, p in model.named_parameters()}
    return {'losses': torch.stack(losses), 'lrs': lrs, 'eval_loss': [e['eval_loss'] for e in evaluations],
            'eval_accuracy': [e['eval_accuracy'] for e in evaluations], 'state': model.state_dict(),
            'groups': [[names[id(p)] for p in group['params']] for group in trainer.optimizer.param_groups],
            'weight_decays': [group['weight_decay'] for group in trainer.optimizer.param_groups]}


class StepRecorder(AbstractCallback):
    """The loss of every training step (kept on the device: no sync per step) and the learning rates of every
    update, read by an optimizer hook as the Trainer's side does."""

    def __init__(self):
        super().__init__('step recorder')
        self.losses, self.lrs = [], []

    def on_train_begin(self):
        self.train_loop_obj.optimizer.register_step_pre_hook(
            lambda opt, *_: self.lrs.append([group['lr'] for group in opt.param_groups]))

    def on_batch_end(self):
        self.losses.append(self.train_loop_obj.loss.detach().clone())


def linear_schedule_of_transformers(optimizer):
    updates = EPOCHS * math.ceil(TRAIN / BATCH)
    schedule = hf().get_linear_schedule_with_warmup(optimizer, math.ceil(WARMUP_RATIO * updates), updates)
    return LRSchedulerCallback(schedule, interval='step')


@pytest.mark.parametrize('schedule', [lambda optimizer: LinearWithWarmupScheduler(warmup_ratio=WARMUP_RATIO),
                                      linear_schedule_of_transformers],
                         ids=['LinearWithWarmupScheduler(warmup_ratio)', 'transformers-scheduler-interval-step'])
def test_loss_every_step_and_lr_every_update_equal_the_trainers(hf_trainer_run, schedule):
    model = tiny_bert(dropout=0.)
    optimizer = torch.optim.AdamW(weight_decay_param_groups(model, WEIGHT_DECAY), lr=LR, fused=True)
    loop = TrainLoop(HFModelWrap(model), loader(TokenData(TRAIN, 1)), loader(TokenData(VAL, 2)), None, optimizer,
                     criterion=None)
    recorder = StepRecorder()
    loop.fit(num_epochs=EPOCHS, callbacks=[GradNormClip(max_grad_norm=1.0), schedule(optimizer), recorder,
                                           ModelPerformanceEvaluation(ClassificationResultPackage(), None)])
    assert torch.equal(torch.stack(recorder.losses), hf_trainer_run['losses'])
    assert recorder.lrs == hf_trainer_run['lrs']
    assert len(recorder.lrs) == 15 and recorder.lrs[1] == [LR / 2] * 2      # the warm-up of 2 updates
    for name, value in model.state_dict().items():
        assert torch.equal(value, hf_trainer_run['state'][name]), name
    assert loop.train_history['val_Accuracy'] == hf_trainer_run['eval_accuracy']
    # the Trainer averages over samples, the loop (by default) over its equal batches
    assert loop.train_history['val_loss'] == pytest.approx(hf_trainer_run['eval_loss'], rel=1e-6)


def test_weight_decay_groups_are_the_trainers(hf_trainer_run):
    model = tiny_bert()
    names = {id(p): name for name, p in model.named_parameters()}
    groups = weight_decay_param_groups(model, WEIGHT_DECAY)
    assert [[names[id(p)] for p in group['params']] for group in groups] == hf_trainer_run['groups']
    assert [group['weight_decay'] for group in groups] == hf_trainer_run['weight_decays']
    assert 'bert.embeddings.LayerNorm.weight' in hf_trainer_run['groups'][1]


def test_decay_parameter_names_follow_the_trainers_rule_on_other_models():
    class RMSNormModel(nn.Module):      # normalisation layers that are not nn.LayerNorm, known by their names
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.norm = nn.RMSNorm(4)
            self.block = nn.ModuleDict({'final_layer_norm': nn.RMSNorm(4), 'out': nn.Linear(4, 2, bias=False),
                                        'ln': nn.LayerNorm(4)})
            self.scale = nn.Parameter(torch.ones(4))

    for model in (tiny_gpt2(), RMSNormModel()):
        # the Trainer's list also names a tied weight twice (GPT-2's lm_head.weight is its input embedding)
        theirs = set(hf().Trainer.get_decay_parameter_names(None, model))
        assert decay_parameter_names(model) == [name for name, _ in model.named_parameters() if name in theirs]
    assert decay_parameter_names(RMSNormModel()) == ['scale', 'proj.weight', 'block.out.weight']


# ---- the feed: one forward for the loss and the predictions ---------------------------------------------------------

class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        model.register_forward_hook(lambda *_: setattr(self, 'calls', self.calls + 1))


def test_get_loss_and_predictions_gives_what_the_two_calls_give_from_one_forward():
    model, feed = tiny_bert().eval(), HFFeedDefinition()
    batch = next(iter(loader(TokenData(VAL, 2))))
    counter = ForwardCounter(model)
    with torch.no_grad():
        loss, y_pred, y_true, metadata = feed.get_loss_and_predictions(model, batch, None, torch.device('cpu'))
        assert counter.calls == 1
        assert torch.equal(loss, feed.get_loss_eval(model, batch, None, torch.device('cpu')))
        expected_pred, expected_true, expected_metadata = feed.get_predictions(model, batch, torch.device('cpu'))
    assert torch.equal(y_pred, expected_pred) and torch.equal(y_true, expected_true) and metadata == expected_metadata
    assert y_pred.shape == (BATCH, CLASSES) and torch.equal(y_true, batch['labels'])
    # with a criterion: criterion(logits, labels), the labels kept out of the forward pass
    with torch.no_grad():
        weighted = nn.CrossEntropyLoss(weight=torch.tensor([1., 2., 3.]))
        loss, y_pred, _, _ = feed.get_loss_and_predictions(model, batch, weighted, torch.device('cpu'))
    assert torch.equal(loss, weighted(y_pred, batch['labels']))


def test_a_causal_lm_trains_as_a_hand_written_loop():
    data = TokenData(16, 3, lm=True)
    model = tiny_gpt2()
    torch.manual_seed(1)
    losses = []
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(2):
        for batch in loader(data):
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())

    ours = tiny_gpt2()
    loop = TrainLoop(HFModelWrap(ours), loader(data), loader(data), None,
                     torch.optim.AdamW(ours.parameters(), lr=1e-3), criterion=None)
    recorder = StepRecorder()
    torch.manual_seed(1)
    loop.fit(num_epochs=2, callbacks=[recorder])
    assert torch.equal(torch.stack(recorder.losses), torch.stack(losses))
    for name, value in ours.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name
    # predictions: the logits of every token, the labels as the batches held them
    logits, labels, _ = loop.predict_on_validation_set()
    assert logits.shape == (16, SEQ, VOCAB) and torch.equal(labels, data.ids)


# ---- bad input, each named with its fix ----------------------------------------------------------------------------

def bert_loop(criterion=None, model=None, **kwargs):
    model = model if model is not None else HFModelWrap(tiny_bert())
    module = model.model if isinstance(model, HFModelWrap) else model
    return TrainLoop(model, loader(TokenData(BATCH, 1)), None, None,
                     torch.optim.AdamW(module.parameters(), lr=LR), criterion, **kwargs)


def test_is_transformers_schedule_knows_transformers_schedules_only():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    assert all(is_transformers_schedule(schedule) for schedule in (
        hf().get_linear_schedule_with_warmup(optimizer, 1, 10), hf().get_cosine_schedule_with_warmup(optimizer, 1, 10),
        hf().get_constant_schedule(optimizer), hf().get_inverse_sqrt_schedule(optimizer, 2),
        hf().get_scheduler('cosine_with_restarts', optimizer, num_warmup_steps=1, num_training_steps=10)))
    assert not any(is_transformers_schedule(schedule) for schedule in (
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9 ** step),
        torch.optim.lr_scheduler.StepLR(optimizer, 2), object()))


def test_a_transformers_schedule_passed_bare_is_refused_naming_its_wrapper():
    loop = bert_loop()
    with pytest.raises(TypeError, match=r"schedule of transformers .* LRSchedulerCallback\(scheduler, "
                                        r"interval='step'\)"):
        loop.fit(num_epochs=1, callbacks=[hf().get_linear_schedule_with_warmup(loop.optimizer, 1, 5)])
    with pytest.raises(TypeError, match=r"torch scheduler .* LRSchedulerCallback\(scheduler, interval='step'\) .* "
                                        r"or interval='epoch'"):
        loop.fit(num_epochs=1, callbacks=[torch.optim.lr_scheduler.StepLR(loop.optimizer, 1)])


@pytest.mark.parametrize('make', [
    lambda optimizer: LRSchedulerCallback(hf().get_linear_schedule_with_warmup(optimizer, 1, 5)),
    lambda optimizer: LRSchedulerCallback(hf().get_cosine_schedule_with_warmup, num_warmup_steps=1,
                                          num_training_steps=5),
    lambda optimizer: GeneralLRSchedulerCallback(hf().get_linear_schedule_with_warmup, num_warmup_steps=1,
                                                 num_training_steps=5),
    lambda optimizer: LambdaLRScheduler(hf().get_linear_schedule_with_warmup(optimizer, 1, 5).lr_lambdas[0]),
], ids=['built', 'function', 'GeneralLRSchedulerCallback', 'LambdaLRScheduler'])
def test_a_transformers_schedule_is_never_stepped_per_epoch(make):
    loop = bert_loop()
    before = {name: value.clone() for name, value in loop.model.state_dict().items()}
    with pytest.raises(ValueError, match=r"transformers' schedules \(LambdaLR of get_\w+_schedule_with_warmup\), "
                                         r"which count optimizer updates.*interval='step'"):
        loop.fit(num_epochs=1, callbacks=[make(loop.optimizer)])
    assert all(torch.equal(value, before[name]) for name, value in loop.model.state_dict().items())


def test_a_transformers_schedule_with_interval_step_steps_after_every_update():
    loop, recorder = bert_loop(), StepRecorder()
    schedule = hf().get_linear_schedule_with_warmup(loop.optimizer, 2, 4)
    loop.fit(num_epochs=4, callbacks=[LRSchedulerCallback(schedule, interval='step'), recorder])
    assert recorder.lrs == [[LR * factor] for factor in (0., 0.5, 1., 0.5)]


class BasicBert(TTBasicModel):
    def __init__(self):
        super().__init__()
        self.bert = tiny_bert()

    def forward(self, *inputs):
        return self.bert(*inputs).logits


@pytest.mark.parametrize('make', [lambda: MultiGPUModelWrap(tiny_bert()), BasicBert],
                         ids=['MultiGPUModelWrap', 'TTBasicModel'])
def test_a_model_taking_inputs_and_target_on_dict_batches_names_hf_model_wrap(make):
    with pytest.raises(TypeError, match=r"splits a batch into \(\*inputs, target\), but this batch is a dict with the "
                                        r"keys \['attention_mask', 'input_ids', 'labels'\].*HFModelWrap\(model\) with "
                                        r"criterion=None"):
        bert_loop(model=make(), criterion=nn.CrossEntropyLoss()).fit(num_epochs=1)


def test_hf_feed_bad_batches_and_outputs_are_named():
    model, feed, cpu = tiny_bert(), HFFeedDefinition(), torch.device('cpu')
    batch = next(iter(loader(TokenData(BATCH, 1))))
    with pytest.raises(TypeError, match=r'model\(\*\*batch\), so a batch must be a dict of tensors .* but it is a '
                                        r'tuple of 2 elements'):
        feed.get_loss(model, (batch['input_ids'], batch['labels']), None, cpu)
    unlabelled = {key: value for key, value in batch.items() if key != 'labels'}
    with pytest.raises(ValueError, match=r"returned no loss: .* the keys \['attention_mask', 'input_ids'\]; put the "
                                         r"labels under 'labels'"):
        feed.get_loss(model, unlabelled, None, cpu)
    with pytest.raises(ValueError, match=r"a criterion is given but the batch has no 'labels'"):
        feed.get_loss(model, unlabelled, nn.CrossEntropyLoss(), cpu)
    with pytest.raises(ValueError, match=r"has no 'scores'; pass HFFeedDefinition\(logits_key=...\)"):
        HFFeedDefinition(logits_key='scores').get_predictions(model, batch, cpu)
    with pytest.raises(TypeError, match=r'returned Tensor, not a ModelOutput with a loss'):
        feed.get_loss(nn.Identity(), {'input': torch.zeros(2)}, None, cpu)


def test_a_default_fit_evaluates_the_validation_set_once_for_the_loss_and_the_metric():
    model = tiny_bert()
    eval_forwards = []
    model.register_forward_hook(lambda module, args, kwargs, output: eval_forwards.append(len(kwargs['input_ids']))
                                if not module.training else None, with_kwargs=True)
    loop = TrainLoop(HFModelWrap(model), loader(TokenData(TRAIN, 1)), loader(TokenData(VAL, 2)), None,
                     torch.optim.AdamW(model.parameters(), lr=LR), criterion=None)
    loop.fit(num_epochs=2, callbacks=[ModelPerformanceEvaluation(ClassificationResultPackage(), None)])
    # per epoch one pass over the 16 validation examples gives both val_loss and val_Accuracy; at the end the
    # metric's train_end_ value reuses the last epoch's predictions; no pass over the training set
    assert sum(eval_forwards) == 2 * VAL
    assert len(loop.train_history['val_loss']) == len(loop.train_history['val_Accuracy']) == 2
