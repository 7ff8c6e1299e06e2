"""Small helpers shared by the callback modules (argument checks, metric direction, matplotlib figures)."""
import numbers


def check_int(name, value, minimum=1, allow_none=False, who=None):
    """Raise ValueError unless ``value`` is an int (not a bool) >= ``minimum`` (or None with allow_none)."""
    if value is None and allow_none:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        prefix = f'{who}: ' if who else ''
        raise ValueError(f'{prefix}{name} must be an int >= {minimum}{" or None" if allow_none else ""}, '
                         f'got {value!r}')
    return value


def is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def lower_is_better(metric_name):
    """Losses and errors improve downwards, everything else upwards."""
    name = metric_name.lower()
    return 'loss' in name or 'error' in name


def import_matplotlib(who):
    """Fail early, with the install hint, when the plots extra is missing."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as exc:
        raise ImportError(f'{who} needs matplotlib: pip install aitoolbox_like[plots]') from exc


def new_figure(**kwargs):
    """A standalone matplotlib Figure with its own Agg canvas: no pyplot global state (style, backend, open
    figures), no display needed, freed with the object."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig
