"""ROUGE (AIToolbox's ``ROUGEMetric`` and ``ROUGEPerlMetric``).

``ROUGEMetric`` computes ROUGE-1, ROUGE-2 and ROUGE-L with Google's rouge-score package, a re-implementation of the
ROUGE-1.5.5 Perl script (AIToolbox used the unmaintained ``rouge`` package, whose F-score carried a 1e-8 term in its
denominator and whose ROUGE-L was summary-level: on one-sentence texts the values agree to 1e-8). The result keeps
AIToolbox's layout: ``{'rouge-1': {'f': F, 'p': precision, 'r': recall}, 'rouge-2': {...}, 'rouge-l': {...}}``, the
mean over the text pairs.

``ROUGEPerlMetric`` runs the Perl script itself through pyrouge, as AIToolbox did; where no Perl ROUGE-1.5.5 is
installed it refuses with an error that names ``ROUGEMetric``.
"""
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence

from ...results.metrics import AbstractBaseMetric
from .._requires import require
from .text_dump import DEFAULT_CLEANING_REGEX, dump_answer_text_to_disk, fresh_folder, regex_clean_text

__all__ = ['ROUGEMetric', 'ROUGEPerlMetric']

# rouge-score's names of the three scores, and AIToolbox's
_ROUGE_TYPES = {'rouge1': 'rouge-1', 'rouge2': 'rouge-2', 'rougeL': 'rouge-l'}


class ROUGEMetric(AbstractBaseMetric):
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F-score, precision and recall over pairs of texts (rouge-score)."""

    def __init__(self, y_true: Sequence[Any], y_predicted: Sequence[Sequence[str]], target_actual_text: bool = False,
                 output_text_dir: Optional[str] = None,
                 output_text_cleaning_regex: Sequence[str] = DEFAULT_CLEANING_REGEX, use_stemmer: bool = False) -> None:
        """ROUGE score calculation

        Args:
            y_true (list): the reference texts, as token lists (or strings when ``target_actual_text``)
            y_predicted (list): the predicted texts, as token lists
            target_actual_text (bool): ``y_true`` holds strings rather than token lists
            output_text_dir (str or None): also write the texts there, one file per pair (for reading only)
            output_text_cleaning_regex (list): patterns removed from the tokens written to ``output_text_dir``
            use_stemmer (bool): Porter-stem the words before matching (ROUGE-1.5.5's ``-m``)
        """
        self.output_text_cleaning_regex = output_text_cleaning_regex
        self.target_actual_text = target_actual_text
        self.output_text_dir = output_text_dir
        self.use_stemmer = use_stemmer
        super().__init__(y_true, y_predicted, metric_name='ROGUE', np_array=False)

    def calculate_metric(self) -> Dict[str, Dict[str, float]]:
        if self.output_text_dir is not None:
            dump_answer_text_to_disk(self.y_true, self.y_predicted, self.output_text_dir,
                                     self.output_text_cleaning_regex, self.target_actual_text)
        self.prepare_text()
        rouge_scorer = require('rouge_score.rouge_scorer', 'rouge-score', 'ROUGEMetric')
        scorer = rouge_scorer.RougeScorer(list(_ROUGE_TYPES), use_stemmer=self.use_stemmer)
        totals = {name: {'f': 0.0, 'p': 0.0, 'r': 0.0} for name in _ROUGE_TYPES.values()}
        for reference, prediction in zip(self.y_true, self.y_predicted):
            scores = scorer.score(reference, prediction)
            for rouge_type, name in _ROUGE_TYPES.items():
                score = scores[rouge_type]
                totals[name]['f'] += score.fmeasure
                totals[name]['p'] += score.precision
                totals[name]['r'] += score.recall
        pairs = len(self.y_true)
        return {name: {key: value / pairs for key, value in parts.items()} for name, parts in totals.items()}

    def prepare_text(self) -> None:
        """Join the token lists into strings (``y_true`` only when it holds token lists)."""
        if not self.target_actual_text:
            self.y_true = [' '.join(map(str, sent)) for sent in self.y_true]
        self.y_predicted = [' '.join(map(str, sent)) for sent in self.y_predicted]

    @staticmethod
    def dump_answer_text_to_disk(true_text: Sequence[Any], pred_text: Sequence[Sequence[str]], output_text_dir: str,
                                 output_text_cleaning_regex: Sequence[str], target_actual_text: bool) -> None:
        """Write each predicted and true text to ``output_text_dir/answer_pred_true_<i>.txt``"""
        dump_answer_text_to_disk(true_text, pred_text, output_text_dir, output_text_cleaning_regex,
                                 target_actual_text)


class ROUGEPerlMetric(AbstractBaseMetric):
    """ROUGE from the Perl ROUGE-1.5.5 script through pyrouge, when both are installed."""

    def __init__(self, y_true: Sequence[Any], y_predicted: Sequence[Sequence[str]], output_text_dir: str,
                 output_text_cleaning_regex: Sequence[str] = DEFAULT_CLEANING_REGEX,
                 target_actual_text: bool = False) -> None:
        """ROUGE score calculation with the Perl implementation

        Args:
            y_true (list): the reference ("model") texts, as token lists (or strings when ``target_actual_text``)
            y_predicted (list): the predicted ("system") texts, as token lists
            output_text_dir (str): folder the texts are written to for the script
            output_text_cleaning_regex (list): patterns removed from the tokens first
            target_actual_text (bool): ``y_true`` holds strings rather than token lists

        Raises:
            RuntimeError: no ``perl`` on the PATH, or pyrouge finds no ROUGE-1.5.5 installation
            ImportError: pyrouge is not installed
        """
        self.output_text_dir = output_text_dir
        self.output_text_cleaning_regex = output_text_cleaning_regex
        self.target_actual_text = target_actual_text
        super().__init__(y_true, y_predicted, metric_name='ROGUE_Perl', np_array=False)

    def calculate_metric(self) -> Dict[str, Any]:
        rouge = self._perl_rouge()
        self.dump_answer_text_to_disk(self.y_true, self.y_predicted, self.output_text_dir,
                                      self.output_text_cleaning_regex, self.target_actual_text)
        # In ROUGE's terms the predictions are the 'system' summaries and the references the 'model' ones.
        rouge.system_dir = os.path.join(self.output_text_dir, 'pred_answer')
        rouge.model_dir = os.path.join(self.output_text_dir, 'true_answer')
        rouge.system_filename_pattern = r'pred_answer_text.(\d+).txt'
        rouge.model_filename_pattern = 'true_answer_text.#ID#.txt'
        return dict(rouge.output_to_dict(rouge.convert_and_evaluate()))

    @staticmethod
    def _perl_rouge() -> Any:
        alternative = ('ROUGEMetric computes the same ROUGE-1/2/L scores with rouge-score, a Python '
                       're-implementation of ROUGE-1.5.5 (QuestionAnswerResultPackage(use_perl_rouge=False))')
        if shutil.which('perl') is None:
            raise RuntimeError(f'ROUGEPerlMetric runs the Perl ROUGE-1.5.5 script, and there is no perl on the PATH. '
                               f'{alternative}.')
        pyrouge = require('pyrouge', 'pyrouge', 'ROUGEPerlMetric',
                          install=f'pip install pyrouge, and install the Perl ROUGE-1.5.5 script for it; or: '
                                  f'{alternative}')
        try:
            return pyrouge.Rouge155()
        except Exception as exc:
            raise RuntimeError(f'ROUGEPerlMetric: pyrouge found no ROUGE-1.5.5 installation ({exc}); install the Perl '
                               f'script and point pyrouge at it with pyrouge_set_rouge_path, or use {alternative}.'
                               ) from exc

    @staticmethod
    def dump_answer_text_to_disk(true_text: Sequence[Any], pred_text: Sequence[Sequence[str]], output_text_dir: str,
                                 output_text_cleaning_regex: Sequence[str], target_actual_text: bool) -> None:
        """Write the texts the Perl script reads: ``true_answer/true_answer_text.<i>.txt`` and
        ``pred_answer/pred_answer_text.<i>.txt`` under ``output_text_dir`` (emptied first)"""
        fresh_folder(output_text_dir)
        for folder, prefix, texts, as_is in (('true_answer', 'true_answer_text', true_text, target_actual_text),
                                             ('pred_answer', 'pred_answer_text', pred_text, False)):
            os.makedirs(os.path.join(output_text_dir, folder))
            for i, text in enumerate(texts):
                tokens: List[str] = [str(text)] if as_is else regex_clean_text(text, output_text_cleaning_regex)
                with open(os.path.join(output_text_dir, folder, f'{prefix}.{i}.txt'), 'w', encoding='utf-8') as file:
                    file.write(' '.join(tokens) or ' ')

    @staticmethod
    def regex_clean_text(text: Sequence[str], cleaning_regex_list: Sequence[str]) -> List[str]:
        """The tokens with the patterns removed; empty tokens dropped"""
        return regex_clean_text(text, cleaning_regex_list)
