"""MkDocs hooks (see mkdocs.yml): the home page is README.md, the example page is examples/digits_cnn.py.

README.md is written for the repository root, so its links are rewritten for the site: ``docs/X`` becomes
``X``, a link to a folder becomes its README.md page, and ``examples/digits_cnn.py`` becomes the example page.
Folder links in the docs pages (``callbacks/``, as GitHub shows them) are rewritten to the folder's README.md
page the same way, so the strict build checks them like every other link.
"""
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent
EXAMPLE = 'examples/digits_cnn.py'
LINK = re.compile(r'\]\(([^)\s#]+)(#[^)\s]*)?\)')


def _example_page():
    source = (ROOT / EXAMPLE).read_text()
    return (f'# Example: `{EXAMPLE}`\n\nTrains a small CNN on the 8x8 digit images that ship with scikit-learn, '
            f'with a custom callback; `make demo` runs it.\n\n```python\n{source.rstrip()}\n```\n')


def on_files(files, config):
    files.append(File.generated(config, 'index.md', content=(ROOT / 'README.md').read_text()))
    files.append(File.generated(config, 'example.md', content=_example_page()))
    return files


def _rewrite(target, page_dir, docs_dir, from_readme):
    if '://' in target or target.startswith(('mailto:', '/')):
        return target
    if from_readme:
        if target == EXAMPLE:
            return 'example.md'
        if target.startswith('docs/'):
            target = target[len('docs/'):]
    if target.endswith('/'):
        folder = posixpath.normpath(posixpath.join(page_dir, target))
        if (Path(docs_dir) / folder / 'README.md').is_file():
            return target + 'README.md'
    return target


def on_page_markdown(markdown, page, config, files):
    from_readme = page.file.src_uri == 'index.md'
    page_dir = posixpath.dirname(page.file.src_uri)

    def replace(match):
        target = _rewrite(match.group(1), page_dir, config['docs_dir'], from_readme)
        return f']({target}{match.group(2) or ""})'

    return LINK.sub(replace, markdown)
