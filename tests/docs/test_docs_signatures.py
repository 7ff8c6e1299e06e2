"""Documented signatures agree with the code.

README.md, docs/**/*.md and examples/**/*.md show signatures and calls of the public API as inline code and in
headings, e.g. ``fit(num_epochs=0, num_iterations=0, callbacks=None, ...)``, ``TrainLoop(..., compile=True)`` or
``## EarlyStopping(monitor='val_loss', ...)``. Each one naming something of aitoolbox_like (a public class or
function: tests/project/public_surface.txt's names and the public names of its modules; one of their methods; ``loop.x``
for a TrainLoop method; a dotted ``aitoolbox_like.x.y`` path) is checked against ``inspect.signature`` of the real
object. A call (``fit(num_epochs=3)``, ``TrainLoop(..., compile=True)``, ``ModelCheckpoint(..., monitor='val_acc')``):
every keyword it names exists (a ``**kwargs`` of the real signature takes any; ``fit``'s takes what the gpu_mode
launchers take). A signature, i.e. two or more items all written as parameters (``name``, ``name=default``,
``*args``, ``**kwargs``, and ``...`` for the ones left out):

* every parameter it names exists, in the real order;
* each ``name=default`` is the real default;
* without ``...`` it claims to be the whole signature: every real parameter must be in it (``*args`` /
  ``**kwargs`` too).

A call written with two or more default-looking keywords reads as a signature: write ``...`` in it. A line holding
``<!-- docs-test: no-signature-check -->`` is left out (a mistake shown on purpose, a method of another class).

Python blocks also override hooks of public classes (``class Net(TTModel): def get_loss(self, batch_data, ...)``):
an override's parameters must be the base method's, or the loop would call it with other arguments. (The blocks
themselves run in tests/docs/test_docs.py.) Names that are not ours (``torch.load(...)``, ``wandb.init(...)``,
``fn(loop)``) are not collected.
"""
import ast
import difflib
import functools
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SURFACE = ROOT / 'tests' / 'project' / 'public_surface.txt'

_FENCE = re.compile(r'^(```|~~~)(\w*)[^\n]*\n(.*?)^\1[ \t]*$', re.S | re.M)
_SPAN = re.compile(r'`([^`]+)`')
_CALL = re.compile(r'^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)\((.*)\)\s*$', re.S)
_HEADING = re.compile(r'^#{1,6}[ \t]+(.+?)[ \t]*$', re.M)
_IDENTIFIER = re.compile(r'^[A-Za-z_]\w*$')
_DOTTED = re.compile(r'^[A-Za-z_][\w.]*$')
ELLIPSIS = '...'
# On a line of the documentation: its spans are not checked (a mistake shown on purpose, another class's method).
SKIP_MARKER = '<!-- docs-test: no-signature-check -->'

# Receivers the documentation uses for a TrainLoop (``loop.fit(...)``, ``self.train_loop_obj.backward(loss)``).
LOOP_NAMES = {'loop', 'train_loop', 'tl', 'train_loop_obj', 'self.train_loop_obj', 'TrainLoop'}


def doc_files():
    return [ROOT / 'README.md'] + sorted((ROOT / 'docs').rglob('*.md')) + sorted((ROOT / 'examples').rglob('*.md'))


def _line(text, offset):
    return text.count('\n', 0, offset) + 1


def inline_calls(path):
    """``(line, name, arguments)`` of every inline code span of ``path`` that is a whole call ``name(arguments)``."""
    text = path.read_text()
    # Fenced blocks blanked out, keeping the line numbers.
    prose = _FENCE.sub(lambda m: '\n' * m.group(0).count('\n'), text)
    lines = prose.split('\n')
    spans = [(match.start(), match.group(1)) for match in _SPAN.finditer(prose)]
    # Headings of the callback pages are signatures too: ``## EarlyStopping(monitor='val_loss', ...)``.
    spans += [(match.start(), match.group(1).replace('`', '')) for match in _HEADING.finditer(prose)]
    calls = []
    for offset, span in sorted(spans):
        call = _CALL.match(span)
        line = _line(prose, offset)
        if call and '\n\n' not in span and call.group(2).strip() and SKIP_MARKER not in lines[line - 1]:
            calls.append((line, call.group(1), ' '.join(call.group(2).split())))
    return calls


def python_blocks(path):
    """``(first line, code)`` of every ```python block of ``path``."""
    text = path.read_text()
    return [(_line(text, m.start(3)), m.group(3)) for m in _FENCE.finditer(text) if m.group(2) == 'python']


def split_arguments(arguments):
    """The top-level comma-separated items of an argument list (brackets and quotes respected)."""
    items, depth, quote, current = [], 0, None, ''
    for char in arguments:
        if depth < 0:
            return None           # not one call: ``type(optimizer)(param_groups)``
        if quote:
            quote = None if char == quote else quote
        elif char in '\'"':
            quote = char
        elif char in '([{':
            depth += 1
        elif char in ')]}':
            depth -= 1
        elif char == ',' and depth == 0:
            items.append(current.strip())
            current = ''
            continue
        current += char
    items.append(current.strip())
    return [item for item in items if item] if depth == 0 else None


class Item:
    """One documented argument: ``name`` (or None for a value such as ``'val_loss'``), ``value`` text after
    ``=`` (None for a bare name), ``kind``: 'positional', 'keyword', 'var_positional', 'var_keyword', 'ellipsis'."""

    def __init__(self, text):
        self.text = text
        self.name, self.value = None, None
        if text == ELLIPSIS:
            self.kind = 'ellipsis'
        elif text.startswith('**'):
            self.kind, self.name = 'var_keyword', text[2:]
        elif text.startswith('*'):
            self.kind, self.name = 'var_positional', text[1:]
        elif re.match(r'^[A-Za-z_]\w*\s*=(?!=)', text):
            name, value = text.split('=', 1)
            self.kind, self.name, self.value = 'keyword', name.strip(), value.strip()
        else:
            self.kind = 'positional'
            self.name = text if _IDENTIFIER.match(text) else None

    def is_parameter(self):
        """Whether the item reads as a parameter of a signature (``name``, ``name=default``, ``*args``,
        ``**kwargs``), not as an argument of a call (``'val_loss'``, ``callbacks=[...]``, ``**optimizer.defaults``)."""
        if self.kind == 'keyword':
            return self.shows_default()
        return self.kind in ('positional', 'var_positional', 'var_keyword') and bool(self.name) and \
            bool(_IDENTIFIER.match(self.name))

    def shows_default(self):
        """Whether the value reads as a default (a literal or a plain name), not a placeholder (``...``, ``<id>``,
        ``[...]``) or an expression of a call."""
        if self.value is None or ELLIPSIS in self.value:
            return False
        return _literal(self.value) is not _NOT_LITERAL or bool(_DOTTED.match(self.value))


_NOT_LITERAL = object()


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _NOT_LITERAL


def _public_objects():
    """Short name -> the public classes and functions of that name: tests/project/public_surface.txt's ``module:Name``
    entries, and the public names its modules define."""
    objects = {}
    for entry in SURFACE.read_text().split():
        module_name, _, name = entry.partition(':')
        try:
            module = importlib.import_module(module_name)
        except Exception:       # an optional dependency missing here: test_public_surface.py reports it
            continue
        if name:
            found = [(name, getattr(module, name, None))]
        else:
            found = [(attr, obj) for attr, obj in vars(module).items() if not attr.startswith('_') and
                     getattr(obj, '__module__', '').startswith('aitoolbox_like')]
        for attr, obj in found:
            if callable(obj):
                objects.setdefault(attr, []).append(obj)
    return {name: _distinct(found) for name, found in objects.items()}


def _distinct(objects):
    seen, kept = set(), []
    for obj in objects:
        key = id(inspect.unwrap(obj.__func__ if inspect.ismethod(obj) else obj))
        if key not in seen:
            seen.add(key)
            kept.append(obj)
    return kept


def _methods(classes):
    """Method name -> the public classes' methods of that name (what a bare ``on_epoch_end(...)`` can mean)."""
    methods = {}
    for cls in classes:
        for name, member in inspect.getmembers(cls):
            if (not name.startswith('_') or name == '__call__') and inspect.isfunction(member) and \
                    member.__module__.startswith('aitoolbox_like'):     # not nn.Module.type, .to, ...
                methods.setdefault(name, []).append(member)
    return {name: _distinct(found) for name, found in methods.items()}


class Resolver:
    def __init__(self):
        from aitoolbox_like import TrainLoop
        self.train_loop = TrainLoop
        self.objects = _public_objects()
        classes = _distinct([obj for found in self.objects.values() for obj in found if inspect.isclass(obj)])
        self.classes = {cls.__name__: cls for cls in classes}
        self.methods = _methods(classes)

    def resolve(self, dotted):
        """The aitoolbox_like objects ``dotted`` can name (several when a bare method name is ambiguous); empty
        when it names something else (torch.load, wandb.init, a placeholder)."""
        if dotted.startswith('aitoolbox_like.'):
            return self._import_path(dotted)
        receiver, _, name = dotted.rpartition('.')
        if receiver in LOOP_NAMES:
            return [getattr(self.train_loop, name)] if hasattr(self.train_loop, name) else []
        if receiver:
            cls = self.classes.get(receiver.rsplit('.', 1)[-1])
            return [getattr(cls, name)] if cls is not None and hasattr(cls, name) else []
        if name in self.objects:
            return self.objects[name]
        if hasattr(self.train_loop, name) and callable(getattr(self.train_loop, name)):
            return [getattr(self.train_loop, name)]
        return self.methods.get(name, [])

    @staticmethod
    def _import_path(dotted):
        parts = dotted.split('.')
        for split in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module('.'.join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return []
            return [obj] if callable(obj) else []
        return []


def real_parameters(obj):
    """The parameters a user writes: without the ``self`` of a method taken from its class."""
    try:
        parameters = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None
    if parameters and parameters[0].name in ('self', 'cls') and not inspect.isclass(obj):
        parameters = parameters[1:]
    return parameters


def extra_keywords(obj):
    """Keywords a ``**kwargs`` is documented to take: TrainLoop.fit passes them to the gpu_mode's launcher."""
    from aitoolbox_like import TrainLoop
    if getattr(obj, '__qualname__', '') == TrainLoop.fit.__qualname__:
        from aitoolbox_like.engine.launch import fit_ddp, fit_fsdp
        from aitoolbox_like.engine.checks import launcher_parameters
        return set(launcher_parameters(fit_ddp)) | set(launcher_parameters(fit_fsdp)) | {'dp_model_args'}
    return None


def _parameter_text(parameter):
    return {parameter.VAR_KEYWORD: '**', parameter.VAR_POSITIONAL: '*'}.get(parameter.kind, '') + parameter.name


def _shown(value):
    if callable(value) and hasattr(value, '__name__'):
        return value.__name__
    return repr(value)


def _same_default(documented, real):
    literal = _literal(documented)
    if literal is not _NOT_LITERAL:
        if isinstance(literal, bool) or isinstance(real, bool):
            return literal is real                  # True is not 1 here
        try:
            return bool(literal == real)
        except Exception:                           # e.g. a tensor default
            return False
    # A name: a constant (``logging.INFO``) or the default object's own name (``append_predictions``).
    named = _named_value(documented)
    if named is not _NOT_LITERAL:
        return named is real or not callable(named) and named == real
    return documented.rsplit('.', 1)[-1] == getattr(real, '__name__', None)


def _named_value(dotted):
    """The object ``dotted`` names (``logging.INFO``, ``torch.cat``), or _NOT_LITERAL."""
    parts = dotted.split('.')
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:split]))
            for attr in parts[split:]:
                obj = getattr(obj, attr)
            return obj
        except (ImportError, AttributeError):
            continue
    return _NOT_LITERAL


def disagreements(obj, items):
    """What the documented ``items`` get wrong about ``obj``'s signature; empty when they agree."""
    parameters = real_parameters(obj)
    if parameters is None:
        return []
    by_name = {p.name: p for p in parameters}
    order = [p.name for p in parameters]
    shown_order = ', '.join(_parameter_text(p) for p in parameters)
    var_kinds = {p.kind for p in parameters} & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}
    forwarded = extra_keywords(obj)
    items = [item for item in items if not (item.kind == 'positional' and item.name in ('self', 'cls'))]
    listed = [item for item in items if item.kind != 'ellipsis']
    # Two or more parameters written as a signature (``name``, ``name=default``): the documented signature.
    # Anything else is a call, whose keywords must exist (its values and positional arguments are the user's).
    is_signature = len(listed) >= 2 and all(item.is_parameter() for item in listed)
    problems = []

    def unknown(name):
        close = difflib.get_close_matches(name, order + sorted(forwarded or ()), n=1, cutoff=0.5)
        return f'{name!r} is not a parameter ({f"did you mean {close[0]!r}? " if close else ""}the code has ' \
               f'({shown_order}))'

    for item in listed:
        if item.kind == 'keyword' and item.name not in by_name:
            if forwarded is not None and item.name not in forwarded or \
                    forwarded is None and inspect.Parameter.VAR_KEYWORD not in var_kinds:
                problems.append(unknown(item.name))
        elif is_signature and item.kind == 'positional' and item.name not in by_name:
            problems.append(unknown(item.name))
        elif is_signature and item.kind in ('var_positional', 'var_keyword'):
            kind = inspect.Parameter.VAR_KEYWORD if item.kind == 'var_keyword' else inspect.Parameter.VAR_POSITIONAL
            if kind not in var_kinds:
                problems.append(f'{item.text}: the code takes no {"**kwargs" if item.kind == "var_keyword" else "*args"}')
    if not is_signature:
        return problems

    documented = [item.name for item in listed if item.name in by_name]
    if documented != sorted(documented, key=order.index):
        problems.append(f'documented in the order ({", ".join(documented)}), the code has ({shown_order})')
    for item in listed:
        if item.kind == 'keyword' and item.name in by_name:
            real = by_name[item.name].default
            if real is inspect.Parameter.empty:
                problems.append(f'{item.name}={item.value}: {item.name} has no default in the code')
            elif not _same_default(item.value, real):
                problems.append(f'{item.name}={item.value}: the default is {item.name}={_shown(real)}')
    if not any(item.kind == 'ellipsis' for item in items):
        shown = {item.name for item in listed}
        missing = [_parameter_text(p) for p in parameters if p.name not in shown]
        if missing:
            problems.append(f'shown as the whole signature (no "..."), but it leaves out {", ".join(missing)}')
    return problems


@functools.lru_cache(maxsize=None)
def resolver():
    return Resolver()


def _documented_calls():
    """The documented calls and signatures of aitoolbox_like's objects (``torch.load(...)``, ``fn(loop)``,
    ``type(optimizer)(...)`` are not collected)."""
    calls = []
    for path in doc_files():
        for line, name, arguments in inline_calls(path):
            if resolver().resolve(name) and split_arguments(arguments) is not None:
                calls.append(pytest.param(name, arguments, id=f'{path.relative_to(ROOT).as_posix()}:{line}:{name}'))
    return calls


def test_the_docs_show_signatures():
    names = {param.values[0] for param in _documented_calls()}
    assert {'TrainLoop', 'fit', 'EarlyStopping', 'ModelCheckpoint'} <= names


@pytest.mark.parametrize('name, arguments', _documented_calls())
def test_documented_call_matches_the_code(name, arguments):
    candidates = resolver().resolve(name)
    items = [Item(text) for text in split_arguments(arguments)]
    problems = [disagreements(obj, items) for obj in candidates]
    # A bare method name may mean several classes' methods: documented right when it matches one of them.
    if all(problems):
        where = [f'{getattr(obj, "__module__", "?")}.{getattr(obj, "__qualname__", obj)}' for obj in candidates]
        details = '\n'.join(f'  {w}: ' + '; '.join(p) for w, p in zip(where, problems))
        pytest.fail(f'`{name}({arguments})` disagrees with the code:\n{details}')


def _overridden(bases, method):
    """The public base class method that ``method`` of a class deriving from ``bases`` overrides, or None."""
    for base in bases:
        cls = resolver().classes.get(base)
        if cls is not None and inspect.isfunction(getattr(cls, method, None)):
            real = real_parameters(getattr(cls, method))
            if real is not None and not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in real):
                return cls.__name__, getattr(cls, method)         # not nn.Module.forward(*input): anything goes
    return None


def _overrides():
    found = []
    for path in doc_files():
        for first_line, code in python_blocks(path):
            try:
                tree = ast.parse(code)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [ast.unparse(base).rsplit('.', 1)[-1] for base in node.bases]
                    for method in node.body:
                        if isinstance(method, ast.FunctionDef) and method.name != '__init__' and \
                                _overridden(bases, method.name):
                            line = first_line + method.lineno - 1
                            found.append(pytest.param(bases, method.name, [a.arg for a in method.args.args[1:]],
                                                      id=f'{path.relative_to(ROOT).as_posix()}:{line}:'
                                                         f'{node.name}.{method.name}'))
    return found


def test_the_docs_override_hooks():
    assert {param.values[1] for param in _overrides()} >= {'get_loss', 'get_predictions', 'on_epoch_end'}


@pytest.mark.parametrize('bases, method, parameters', _overrides())
def test_documented_override_has_the_base_methods_parameters(bases, method, parameters):
    base, overridden = _overridden(bases, method)
    real = [p.name for p in real_parameters(overridden)]
    assert parameters == real, \
        f'{base}.{method} takes ({", ".join(real)}), the documentation overrides it with ({", ".join(parameters)})'
