"""MkDocs hooks (see mkdocs.yml): the home page is README.md, the contributing page CONTRIBUTING.md and the example
page examples/digits_cnn.py.

The Markdown files are written for the repository's file tree, where people read them too (GitHub renders them;
tests/docs/test_docs_links.py checks every link there), so their links are rewritten for the site: README's ``docs/X``
becomes ``X``, a link to a folder becomes its README.md page (``callbacks/``, as GitHub shows them), and a link to
``examples/digits_cnn.py`` (``../examples/digits_cnn.py`` from docs/) becomes the example page. The strict build then
checks them like every other link.

The recipe reference, docs/recipes-reference.md, lists every name of the recipe registries. It is generated from
the registries and committed, so that it reads on GitHub too; ``python mkdocs_hooks.py`` writes it again
(tests/recipes/test_reference_docs.py fails when it is out of date). The same command writes the table of hooks in
docs/event-order.md, made from AbstractCallback's methods (tests/docs/test_docs.py checks it).
"""
import html
import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent
EXAMPLE = 'examples/digits_cnn.py'
# Pages made from files at the repository's root (their links are written from there): the home page and this one.
CONTRIBUTING_PAGE = 'contributing.md'
ROOT_PAGES = ('index.md', CONTRIBUTING_PAGE)
RECIPES_REFERENCE = ROOT / 'docs' / 'recipes-reference.md'
EVENT_ORDER = ROOT / 'docs' / 'event-order.md'
HOOKS_BEGIN, HOOKS_END = '<!-- hooks:begin -->', '<!-- hooks:end -->'
LINK = re.compile(r'\]\(([^)\s#]+)(#[^)\s]*)?\)')


def _example_page():
    source = (ROOT / EXAMPLE).read_text()
    return (f'# Example: `{EXAMPLE}`\n\nTrains a small CNN on the 8x8 digit images that ship with scikit-learn, '
            f'with a custom callback; `make demo` runs it.\n\n```python\n{source.rstrip()}\n```\n')


def _cell(text):
    # Table cells: Sphinx roles (:class:`X`) as plain code, HTML-escaped, '|' as an entity (it would split the cell).
    text = re.sub(r':[a-z]+:`~?([^`]+)`', r'`\1`', text)
    return html.escape(text).replace('|', '&#124;')


def recipes_reference_page():
    """Markdown of every registered name, per registry kind, with its recipe arguments and first sentence."""
    from aitoolbox_like.recipes.reference import reference_entries
    from aitoolbox_like.recipes.registry import KINDS

    lines = ['# Recipe reference: every registered name', '',
             '<!-- Generated from the registries by `python mkdocs_hooks.py`: edit the docstrings, not this file. -->',
             '',
             'Generated from the registries: what a recipe can name without '
             'registering anything (see [Recipes](recipes.md)). Each entry shows the arguments a recipe gives, '
             'with their defaults; the recipe fills the ones it builds itself (an optimizer\'s parameters, a '
             'scheduler\'s optimizer, a loop\'s model, loaders, optimizer and criterion). '
             '`aitoolbox-like list KIND` prints the same, with your own registered names.', '']
    for kind, description in KINDS.items():
        entries = reference_entries(kind, builtin_only=True)     # not what a recipe run registered in this process
        lines += [f'## {kind}', '', f'{description[0].upper()}{description[1:]}.', '']
        if not entries:
            lines += ['None built in: register yours (`@register_' + kind + '`) or name them by import path.', '']
            continue
        lines += ['| name | arguments | description |', '|---|---|---|']
        for name, signature, summary in entries:
            lines.append(f'| `{name}` | <code>{_cell(signature)}</code> | {_cell(summary)} |')
        lines.append('')
    return '\n'.join(lines).rstrip('\n') + '\n'


def hooks_table():
    """The Markdown table of every hook, in the order of a fit: AbstractCallback's methods (callback.py), each with
    its signature and the first sentence of its docstring."""
    import inspect

    from aitoolbox_like.engine.callback import HOOK_NAMES, AbstractCallback

    lines = [HOOKS_BEGIN, '<!-- Made from AbstractCallback by `python mkdocs_hooks.py`: edit the docstrings. -->', '',
             '| hook | when it runs |', '|---|---|']
    for name in HOOK_NAMES:
        method = getattr(AbstractCallback, name)
        parameters = list(inspect.signature(method).parameters)[1:]
        doc = ' '.join(inspect.getdoc(method).split())
        first = doc.split('. ')[0].rstrip('.') + '.'
        # reST literals as Markdown code; a '|' would split the cell
        first = re.sub(r'``([^`]+)``', r'`\1`', first).replace('|', '&#124;')
        # A call shown in the description (the model's ``train_step(batch, loop)``) is another method's: the
        # signature check of tests/docs/test_docs_signatures.py leaves the line out (the hook's own cell is the code's).
        calls = [span for span in re.findall(r'`([^`]*)`', first) if '(' in span]
        skip = ' <!-- docs-test: no-signature-check -->' if calls else ''
        lines.append(f'| `{name}({", ".join(parameters)})` | {first}{skip} |')
    lines.append(HOOKS_END)
    return '\n'.join(lines)


def event_order_page():
    """docs/event-order.md with its table of hooks made again."""
    text = EVENT_ORDER.read_text()
    start, end = text.index(HOOKS_BEGIN), text.index(HOOKS_END) + len(HOOKS_END)
    return text[:start] + hooks_table() + text[end:]


def on_files(files, config):
    from mkdocs.structure.files import File
    files.append(File.generated(config, 'index.md', content=(ROOT / 'README.md').read_text()))
    files.append(File.generated(config, CONTRIBUTING_PAGE, content=(ROOT / 'CONTRIBUTING.md').read_text()))
    files.append(File.generated(config, 'example.md', content=_example_page()))
    return files


def _rewrite(target, page_dir, docs_dir, from_readme):
    if '://' in target or target.startswith(('mailto:', '/')):
        return target
    # Where the link points in the repository: README.md sits at its root, the pages in docs/.
    in_repository = posixpath.normpath(posixpath.join('' if from_readme else posixpath.join('docs', page_dir), target))
    if in_repository == EXAMPLE:
        return posixpath.relpath('example.md', page_dir or '.')
    if in_repository == 'CONTRIBUTING.md':
        return posixpath.relpath(CONTRIBUTING_PAGE, page_dir or '.')
    if from_readme and target.startswith('docs/'):
        target = target[len('docs/'):]
    if target.endswith('/'):
        folder = posixpath.normpath(posixpath.join(page_dir, target))
        if (Path(docs_dir) / folder / 'README.md').is_file():
            return target + 'README.md'
    return target


def on_page_markdown(markdown, page, config, files):
    from_readme = page.file.src_uri in ROOT_PAGES
    page_dir = posixpath.dirname(page.file.src_uri)

    def replace(match):
        target = _rewrite(match.group(1), page_dir, config['docs_dir'], from_readme)
        return f']({target}{match.group(2) or ""})'

    return LINK.sub(replace, markdown)


if __name__ == '__main__':
    RECIPES_REFERENCE.write_text(recipes_reference_page())
    print(f'wrote {RECIPES_REFERENCE.relative_to(ROOT)}')
    EVENT_ORDER.write_text(event_order_page())
    print(f'wrote the table of hooks of {EVENT_ORDER.relative_to(ROOT)}')
