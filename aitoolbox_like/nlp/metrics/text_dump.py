"""Writing predicted and true texts next to an experiment's results, for a person to read (the metrics never read
them back)."""
import os
import re
import shutil
from typing import Any, List, Sequence

__all__ = ['regex_clean_text', 'fresh_folder', 'dump_answer_text_to_disk']

DEFAULT_CLEANING_REGEX = (r'<.*?>', r'[^a-zA-Z0-9.?! ]+')


def regex_clean_text(text: Sequence[str], cleaning_regex_list: Sequence[str]) -> List[str]:
    """The tokens with every match of each pattern removed, in order; tokens left empty are dropped.

    The default patterns (markup tags, then anything but letters, digits, ``.?!`` and space) keep the Perl ROUGE
    script from dividing by zero on tokens it cannot read.
    """
    tokens = list(text)
    for pattern in cleaning_regex_list:
        compiled = re.compile(pattern)
        tokens = [cleaned for cleaned in (compiled.sub('', token) for token in tokens) if cleaned]
    return tokens


def fresh_folder(path: str) -> None:
    """``path`` as a new empty folder (what an earlier evaluation wrote there is replaced)."""
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)


def dump_answer_text_to_disk(true_text: Sequence[Any], pred_text: Sequence[Sequence[str]], output_text_dir: str,
                             output_text_cleaning_regex: Sequence[str], target_actual_text: bool) -> None:
    """One file per answer, ``answer_pred_true_<i>.txt``, with the predicted and the true answer

    Args:
        true_text (list): the true answers, as token lists (or strings when ``target_actual_text``)
        pred_text (list): the predicted answers, as token lists
        output_text_dir (str): the folder (emptied first)
        output_text_cleaning_regex (list): patterns removed from the tokens (:func:`regex_clean_text`)
        target_actual_text (bool): the true answers are strings, written as they are
    """
    fresh_folder(output_text_dir)
    for i, (pred_answer, true_answer) in enumerate(zip(pred_text, true_text)):
        pred_clean = ' '.join(regex_clean_text(pred_answer, output_text_cleaning_regex)) or ' '
        if target_actual_text:
            true_clean = str(true_answer)
        else:
            true_clean = ' '.join(regex_clean_text(true_answer, output_text_cleaning_regex))
        with open(os.path.join(output_text_dir, f'answer_pred_true_{i}.txt'), 'w', encoding='utf-8') as file:
            file.write(f'Answer to question {i}:\nPredicted:\t{pred_clean}\nTrue:\t{true_clean}\n')
