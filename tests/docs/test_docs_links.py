"""Every relative link of README.md, CONTRIBUTING.md, tests/support/README.md, docs/**/*.md and examples/**/*.md
resolves where people read these files: in the repository's file tree, as GitHub renders it (the documentation site is checked by the strict build of
tests/docs/test_docs.py, which mkdocs_hooks.py feeds with the same links).

A relative link must name a file or folder of the repository (from the linking file's folder, inside the
repository), and a ``#fragment`` must be a heading anchor of the target Markdown file as GitHub makes it: the
heading's text, lower-cased, punctuation other than ``-`` and ``_`` removed, spaces turned into ``-``, ``-1``,
``-2``, ... added to repeated headings. mkdocs.yml gives the site's table of contents the same anchors
(pymdownx.slugs), so one link works in both places. A link to a page that exists only in the built site (one that
mkdocs_hooks.py generates) fails here: link the repository file it is made from instead.
"""
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r'^(```|~~~).*?^\1[ \t]*$', re.S | re.M)
_CODE_SPAN = re.compile(r'(`+)(?:(?!\1).)+?\1', re.S)
_HTML_COMMENT = re.compile(r'<!--.*?-->', re.S)
# [text](target "title") and ![alt](target); the text may hold `code` and nested [brackets].
_INLINE_LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+["\'(][^)]*)?\)')
_REFERENCE_DEFINITION = re.compile(r'^[ ]{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$', re.M)
_HTML_LINK = re.compile(r'<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["\']([^"\']+)["\']', re.I)
_HEADING = re.compile(r'^[ ]{0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$', re.M)
_HTML_ANCHOR = re.compile(r'<a\b[^>]*?\b(?:name|id)\s*=\s*["\']([^"\']+)["\']', re.I)


def doc_files():
    return [ROOT / 'README.md', ROOT / 'CONTRIBUTING.md', ROOT / 'tests' / 'support' / 'README.md'] + \
        sorted((ROOT / 'docs').rglob('*.md')) + sorted((ROOT / 'examples').rglob('*.md'))


def _prose(text):
    """The text without fenced blocks, inline code and HTML comments (same length per line, so line numbers
    hold): links inside code are examples, not links."""
    def blank(match):
        return re.sub(r'[^\n]', ' ', match.group(0))
    return _CODE_SPAN.sub(blank, _HTML_COMMENT.sub(blank, _FENCE.sub(blank, text)))


def links(path):
    """``(line, target)`` of every link of the Markdown file ``path``."""
    prose = _prose(path.read_text())
    found = []
    for pattern in (_INLINE_LINK, _REFERENCE_DEFINITION, _HTML_LINK):
        for match in pattern.finditer(prose):
            found.append((prose.count('\n', 0, match.start()) + 1, match.group(1)))
    return sorted(found)


def github_slug(heading):
    """The anchor GitHub gives a heading: of its rendered text (no markup), lower-cased, every character but
    letters, digits, ``_``, ``-`` and spaces dropped, spaces turned into ``-``."""
    text = re.sub(r'!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)', r'\1', heading)      # [text](url) -> text
    text = re.sub(r'<[^>]+>', '', text)                                              # inline HTML tags
    text = text.replace('`', '')
    text = re.sub(r'(\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w))', '', text)                 # emphasis markers
    return re.sub(r'[^\w\- ]', '', text.lower()).replace(' ', '-')


def anchors(path):
    """Every anchor of the Markdown file ``path`` as GitHub renders it (repeated headings get -1, -2, ...)."""
    text = path.read_text()
    prose = _FENCE.sub(lambda match: re.sub(r'[^\n]', ' ', match.group(0)), text)
    found, seen = set(), {}
    for match in _HEADING.finditer(prose):
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f'{slug}-{count}')
    found.update(_HTML_ANCHOR.findall(prose))
    return found


def broken(path, target):
    """Why ``target``, linked from ``path``, does not resolve in the repository's tree; None when it does."""
    if re.match(r'^[a-zA-Z][a-zA-Z0-9+.-]*:', target):
        return None                       # https:, mailto:: not a file of the repository
    if target.startswith('/'):
        return 'an absolute path: GitHub resolves it against its own site root, write a relative one'
    file_part, _, fragment = target.partition('#')
    resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
    if resolved != ROOT and ROOT not in resolved.parents:
        return f'{file_part} leaves the repository'
    if not resolved.exists():
        return f'{resolved.relative_to(ROOT).as_posix()} does not exist in the repository'
    if fragment and resolved.suffix == '.md':
        if unquote(fragment) not in anchors(resolved):
            return f'{resolved.relative_to(ROOT).as_posix()} has no heading with the anchor #{fragment}'
    return None


def _all_links():
    return [pytest.param(path, target, id=f'{path.relative_to(ROOT).as_posix()}:{line}:{target}')
            for path in doc_files() for line, target in links(path)]


def test_the_docs_have_relative_links():
    relative = [param for param in _all_links() if '://' not in param.values[1]]
    assert len(relative) > 50


@pytest.mark.parametrize('path, target', _all_links())
def test_link_resolves_in_the_repository(path, target):
    problem = broken(path, target)
    assert problem is None, f'{path.relative_to(ROOT).as_posix()} links to {target}: {problem}'


def test_github_slugs():
    # GitHub's rule (html-pipeline's TableOfContentsFilter: downcase, drop /[^\p{Word}\- ]/, ' ' -> '-').
    assert github_slug('Restartable runs: elastic torchrun') == 'restartable-runs-elastic-torchrun'
    assert github_slug('Sharded checkpoints (FSDP)') == 'sharded-checkpoints-fsdp'
    assert github_slug("On a Ray cluster (`backend='ray'`)") == 'on-a-ray-cluster-backendray'
    assert github_slug('Saving / resuming') == 'saving--resuming'
    assert github_slug('`fit(resume_from=...)`') == 'fitresume_from'
    assert github_slug('[The guide](user-guide.md) and **more**') == 'the-guide-and-more'
