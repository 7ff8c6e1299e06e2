"""The search space and the checks made before any trial: each SPEC parses to what it says, a malformed one, a bound
the wrong way round, an unknown PATH, a value the recipe refuses and a monitor no epoch records are errors that
name the parameter (all of them at once)."""
import re

import pytest

from aitoolbox_like.recipes import Recipe, RecipeError
from aitoolbox_like.tuning.space import (Param, TuneInputError, check_inputs, override_text, parse_param,
                                         parse_params)


def test_each_spec_kind_parses_to_its_bounds_or_values():
    assert parse_param('optimizer.lr=loguniform(1e-4, 1e-2)') == \
        Param('optimizer.lr', 'loguniform', 1e-4, 1e-2, spec='loguniform(1e-4, 1e-2)')
    assert parse_param('optimizer.lr=uniform(0,0.5)') == Param('optimizer.lr', 'uniform', 0.0, 0.5,
                                                                spec='uniform(0,0.5)')
    assert parse_param('callbacks[6].patience=int(1,5)') == Param('callbacks[6].patience', 'int', 1, 5,
                                                                   spec='int(1,5)')
    # Choice values are typed as override values are: numbers, text (quoted or not), true/false, null.
    choice = parse_param("optimizer.name=choice(Adam, 'SGD', 'a,b', 3, 2.5, true, null)")
    assert choice.kind == 'choice'
    assert list(choice.choices) == ['Adam', 'SGD', 'a,b', 3, 2.5, True, None]
    assert [type(v) for v in choice.choices] == [str, str, str, int, float, bool, type(None)]


@pytest.mark.parametrize('text, message', [
    ('optimizer.lr', 'a parameter is PATH=SPEC'),
    ('optimizer.lr=log_uniform(1e-4,1e-2)', "unknown kind 'log_uniform'; did you mean loguniform?"),
    ('optimizer.lr=loguniform(1e-4)', 'loguniform takes two bounds, loguniform(a,b), got 1 value'),
    ('optimizer.lr=loguniform 1e-4,1e-2', 'expected one of loguniform(a,b)'),
    ('optimizer.lr=loguniform(1e-2,1e-4)', 'the bounds are the wrong way round (low 0.01 > high 0.0001); write '
                                           'loguniform(0.0001,0.01)'),
    ('optimizer.lr=uniform(0.1,0.1)', 'both bounds are 0.1'),
    ('optimizer.lr=loguniform(0,1)', 'the bounds of loguniform are > 0'),
    ('optimizer.lr=uniform(a,1)', 'the bounds are numbers'),
    ('fit.num_epochs=int(1,2.5)', 'the bounds of int(a,b) are integers'),
    ('vars.batch_size=choice()', 'a choice needs at least one value'),
    ('vars.batch_size=choice(32,64,32)', '32 is given twice'),
    ('optimizer.betas=choice([0.9,0.99],[0.8,0.9])', 'a choice holds numbers, text, true/false or null'),
])
def test_a_malformed_parameter_is_an_error_that_names_it(text, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        parse_param(text)
    assert str(error.value).startswith(text.split('=')[0])


def test_every_malformed_parameter_is_reported_at_once():
    with pytest.raises(TuneInputError) as error:
        parse_params(['optimizer.lr=loguniform(1e-2,1e-4)', 'vars.batch_size=choice()', 'optimizer.lr=uniform(0,1)',
                      'optimizer.lr=uniform(0,1)'])
    assert len(error.value.errors) == 3
    assert error.value.errors[2] == '--param optimizer.lr: given twice'


@pytest.mark.parametrize('value', ['Adam', "it's", 'true', '3', 'a,b', '', 3, 2.5, 1e-5, 1e22, True, False, None])
def test_a_sampled_value_reaches_the_recipe_unchanged(value):
    # The override that carries a sampled value into the recipe gives exactly that value back, type included.
    recipe = Recipe.from_text('vars: {x: 0}\nother: ${vars.x}', overrides=[f'vars.x={override_text(value)}'])
    assert recipe.config['vars']['x'] == value and type(recipe.config['vars']['x']) is type(value)
    assert recipe.config['other'] == value      # interpolations follow it, as with any override


def test_an_unknown_path_is_an_error_with_the_close_matches(digits_recipe):
    params = parse_params(['optimizr.lr=loguniform(1e-4,1e-2)', 'vars.batch_sise=choice(32,64)',
                           'optimizer=choice(1,2)'])
    with pytest.raises(TuneInputError) as error:
        check_inputs(digits_recipe, [], params, 'val_loss', 'min')
    assert error.value.errors == [
        '--param optimizr.lr: unknown key path of the recipe; did you mean optimizer.lr?',
        '--param vars.batch_sise: unknown key path of the recipe; did you mean vars.batch_size?',
        '--param optimizer is a section of the recipe, not a value; search one of its keys',
    ]


def test_a_new_key_is_checked_by_the_recipe(digits_recipe):
    # A key the recipe does not set yet is fine where the constructor takes it (Adam's weight_decay) ...
    params = parse_params(['optimizer.weight_decay=loguniform(1e-6,1e-3)'])
    check_inputs(digits_recipe, [], params, 'val_loss', 'min')
    # ... and an error where it does not, with the recipe check's own hint.
    params = parse_params(['optimizer.weight_decy=loguniform(1e-6,1e-3)'])
    with pytest.raises(TuneInputError, match='optimizer.weight_decy: unknown argument of Adam; did you mean '
                                             'weight_decay?'):
        check_inputs(digits_recipe, [], params, 'val_loss', 'min')


def test_every_value_a_parameter_can_take_is_checked_against_the_recipe(digits_recipe):
    params = parse_params(['fit.num_epochs=choice(2,many)', 'callbacks.6.patience=uniform(1,3)'])
    with pytest.raises(TuneInputError) as error:
        check_inputs(digits_recipe, [], params, 'val_loss', 'min')
    assert error.value.errors == [
        "--param fit.num_epochs=choice(2,many): with fit.num_epochs='many': fit.num_epochs: expected int, got 'many'",
        '--param callbacks.6.patience=uniform(1,3): with callbacks.6.patience=1.0: callbacks[6].patience: expected '
        'int, got 1.0',
        '--param callbacks.6.patience=uniform(1,3): with callbacks.6.patience=3.0: callbacks[6].patience: expected '
        'int, got 3.0',
    ]


def test_a_monitor_no_epoch_records_is_an_error_when_the_recipe_tells(digits_recipe):
    # With callbacks and schedules that record nothing, an epoch of the digits recipe records the loop's losses only.
    params = parse_params(['optimizer.lr=loguniform(1e-4,1e-2)'])
    with pytest.raises(TuneInputError) as error:
        check_inputs(digits_recipe, ['callbacks=[{name: EarlyStopping, monitor: val_loss}]',
                                     'schedulers=[{name: StepLR, step_size: 2}]'], params, 'val_los', 'max')
    assert error.value.errors[-1].startswith('--monitor val_los: no epoch of this recipe records it; did you mean '
                                             'val_loss? (an epoch records accumulated_loss, val_loss')
    # A performance-evaluation callback adds val_<metric> names: only the end of the first epoch can tell which.
    evaluation = ('callbacks=[{name: ModelPerformanceEvaluation, result_package: {name: ClassificationResultPackage}, '
                  'args: {}}]')
    check_inputs(digits_recipe, [evaluation], params, 'val_Accuracy', 'max')
    with pytest.raises(TuneInputError, match='--monitor train_Accuracy: no epoch of this recipe records it'):
        check_inputs(digits_recipe, [evaluation], params, 'train_Accuracy', 'max')
    # The digits recipe's own callback (WorstClassReport) may record anything: checked after the first epoch.
    check_inputs(digits_recipe, [], params, 'val_worst_class_errors', 'min')


def test_the_whole_input_is_reported_at_once(digits_recipe):
    params = parse_params(['optimizr.lr=loguniform(1e-4,1e-2)', 'vars.batch_size=choice(32,64)'])
    with pytest.raises(TuneInputError) as error:
        check_inputs(digits_recipe, ['vars.batch_size=32', 'loop.gpu_mode=ddp'], params, 'val_loss', 'lowest')
    assert [e.split(':')[0] for e in error.value.errors] == ['--mode lowest', 'loop.gpu_mode', '--param optimizr.lr',
                                                             '--param vars.batch_size']
    assert 'also set by the override vars.batch_size=...' in error.value.errors[3]
    # A recipe that does not check is reported as `train` reports it.
    with pytest.raises(RecipeError, match='optimizer.lr: expected float or Tensor'):
        check_inputs(digits_recipe, ['optimizer.lr=fast'], params[1:], 'val_loss', 'min')
