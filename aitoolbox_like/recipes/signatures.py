"""What a class or function accepts from a recipe: its signature, its parameters' types (annotations, else the
type of a plain default), and its parameters written out with their defaults (``aitoolbox-like list``)."""
import inspect
import typing
from typing import Any, Dict, List, Optional, Sequence

# Defaults of these types say what the parameter takes when it has no annotation.
_DEFAULT_TYPES = (bool, int, float, str, list, tuple, dict)


def signature_of(target: Any) -> Optional[inspect.Signature]:
    """The constructor / call signature of ``target``, or None when Python cannot tell it (then nothing is
    checked)."""
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def type_hints_of(target: Any) -> Dict[str, Any]:
    """The annotations of ``target``'s parameters, evaluated. A class's are those of its ``__init__``. Names that
    only exist for the type checker (``if TYPE_CHECKING:``) make ``typing.get_type_hints`` fail: then each
    annotation is evaluated on its own and those that do not evaluate are left out."""
    function = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(function)
    except Exception:
        pass
    hints: Dict[str, Any] = {}
    signature = signature_of(target)
    namespace = getattr(inspect.getmodule(function), '__dict__', {})
    for parameter in (signature.parameters.values() if signature is not None else ()):
        annotation = parameter.annotation
        if annotation is inspect.Parameter.empty:
            continue
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(namespace))      # an annotation string of the target's module
            except Exception:
                continue
        hints[parameter.name] = annotation
    return hints


def expected_type(parameter: inspect.Parameter, hints: Dict[str, Any]) -> Any:
    """What a parameter takes: its annotation, else the type of its default (when that is a plain value and not
    None), else None (anything)."""
    if parameter.name in hints:
        return hints[parameter.name]
    default = parameter.default
    if default is not inspect.Parameter.empty and default is not None and type(default) in _DEFAULT_TYPES:
        return type(default)
    return None


def recipe_parameters(target: Any, skip_first: bool = False,
                      filled: Sequence[str] = ()) -> Optional[List[inspect.Parameter]]:
    """The parameters a recipe gives by name (``skip_first``: the first is filled by the recipe, e.g. an
    optimizer's model parameters; ``filled``: named ones the recipe fills). None when the signature is unknown."""
    signature = signature_of(target)
    if signature is None:
        return None
    parameters = list(signature.parameters.values())
    if skip_first and parameters and parameters[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                            inspect.Parameter.POSITIONAL_OR_KEYWORD):
        parameters = parameters[1:]
    return [p for p in parameters if p.name not in filled]


def format_signature(target: Any, skip_first: bool = False, filled: Sequence[str] = ()) -> str:
    """``name=default, other`` for the recipe-visible parameters (functions as defaults by their name)."""
    parameters = recipe_parameters(target, skip_first, filled)
    if parameters is None:
        return '...'
    parts = []
    for p in parameters:
        prefixes: Dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: '*', inspect.Parameter.VAR_KEYWORD: '**'}
        prefix = prefixes.get(p.kind, '')
        if p.default is inspect.Parameter.empty:
            parts.append(prefix + p.name)
        else:
            default = p.default
            shown = getattr(default, '__qualname__', None) if callable(default) else None
            parts.append(f'{p.name}={shown or repr(default)}')
    return ', '.join(parts)


def summary_of(target: Any) -> str:
    """The first sentence of ``target``'s docstring (empty when it has none)."""
    doc = inspect.getdoc(target) or ''
    paragraph = ' '.join(doc.strip().split('\n\n', 1)[0].split())
    end = paragraph.find('. ')
    return paragraph[:end + 1] if end >= 0 else paragraph
