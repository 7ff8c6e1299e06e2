"""String helpers of AIToolbox's ``aitoolbox.nlp.core.core``: ASCII folding, normalisation, ``str2bool`` and
finding a sub-list (an answer span inside a paragraph's tokens)."""
import re
import unicodedata
from typing import Optional, Sequence, Tuple

__all__ = ['unicode_to_ascii', 'normalize_string', 'str2bool', 'find_sub_list']

_TRUE_WORDS = frozenset({'yes', 'true', 't', 'y', '1'})
_FALSE_WORDS = frozenset({'no', 'false', 'f', 'n', '0'})


def unicode_to_ascii(text_string: str) -> str:
    """The string with its accents dropped: ``'Ça déjà'`` -> ``'Ca deja'``.

    The text is decomposed (NFD) and the combining marks removed; characters without an ASCII base stay as they are.
    """
    decomposed = unicodedata.normalize('NFD', text_string)
    return ''.join(char for char in decomposed if unicodedata.category(char) != 'Mn')


def normalize_string(text_string: str, unicode_to_ascii_convert: bool = True) -> str:
    """Lower-case, accents folded, sentence punctuation (``.!?``) split off as its own token, every other run of
    characters that are not ASCII letters or digits replaced by one space, and the ends trimmed.

    Args:
        text_string (str): the text
        unicode_to_ascii_convert (bool): fold accents first (:func:`unicode_to_ascii`)

    Returns:
        str: ``'For this purpose, we propose.'`` -> ``'for this purpose we propose .'``
    """
    text = text_string.lower().strip()
    if unicode_to_ascii_convert:
        text = unicode_to_ascii(text)
    text = re.sub(r'([.!?])', r' \1', text)
    text = re.sub(r'[^0-9a-zA-Z.!?]+', ' ', text)
    return re.sub(r'\s+', ' ', text).strip()


def str2bool(w: str) -> bool:
    """``'yes'``, ``'true'``, ``'t'``, ``'y'``, ``'1'`` (any case) -> True; ``'no'``, ``'false'``, ``'f'``, ``'n'``,
    ``'0'`` -> False (a command-line flag's value).

    Raises:
        ValueError: for any other string
    """
    word = w.lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise ValueError(f'Boolean value expected, got {w!r}: use one of yes/no, true/false, t/f, y/n, 1/0.')


def find_sub_list(sub_list: Sequence, main_list: Sequence) -> Optional[Tuple[int, int]]:
    """Where ``sub_list`` first occurs in ``main_list``, as the indices of its first and last element (inclusive).

    Returns:
        (int, int) or None: ``find_sub_list([1, 2], [5, 1, 2])`` -> ``(1, 2)``; None when it does not occur

    Raises:
        ValueError: ``sub_list`` is longer than ``main_list``
    """
    size = len(sub_list)
    if size > len(main_list):
        raise ValueError(f'sub_list is longer than main_list ({size} > {len(main_list)}); it cannot occur in it')
    if size == 0:
        return None
    sub = list(sub_list)
    for start in range(len(main_list) - size + 1):
        if main_list[start] == sub[0] and list(main_list[start:start + size]) == sub:
            return start, start + size - 1
    return None
