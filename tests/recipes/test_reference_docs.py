"""The generated recipe reference, docs/recipes-reference.md: it is what the registries generate today, and the
documentation site (conftest's docs_site, built as `make docs` builds it) lists every name a recipe can use without
registering anything."""
import sys
from pathlib import Path

import pytest

from aitoolbox_like.recipes.registry import REGISTRIES

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.timeout(180)
@pytest.mark.xdist_group('docs_site')       # the site is built once (conftest's docs_site)
def test_every_registered_name_appears_in_the_generated_reference(docs_site):
    result, site = docs_site
    assert result.returncode == 0, result.stdout + result.stderr
    page = (site / 'recipes-reference' / 'index.html').read_text()
    missing = [f'{kind}:{name}' for kind, registry in REGISTRIES.items() for name in registry.builtin_names()
               if f'<code>{name}</code>' not in page]
    assert missing == []
    assert sum(len(r.builtin_names()) for r in REGISTRIES.values()) > 100
    # Linked from the recipes page, which is in the navigation.
    assert 'href="../recipes-reference/"' in (site / 'recipes' / 'index.html').read_text()


def test_the_committed_reference_is_the_registries_reference():
    # docs/recipes-reference.md is committed (so that it reads on the repository's pages) and generated: what the
    # registries give today must be what it says.
    sys.path.insert(0, str(ROOT))
    try:
        from mkdocs_hooks import RECIPES_REFERENCE, recipes_reference_page
    finally:
        sys.path.remove(str(ROOT))
    assert RECIPES_REFERENCE.read_text() == recipes_reference_page(), \
        'docs/recipes-reference.md is out of date: run `python mkdocs_hooks.py` and commit the file'
