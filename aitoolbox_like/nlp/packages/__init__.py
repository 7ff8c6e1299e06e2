"""The result packages of AIToolbox's ``aitoolbox.nlp.experiment_evaluation.NLP_result_package``: question answering,
summarisation, machine translation, GLUE and XNLI."""
from .benchmarks import GLUEResultPackage, XNLIResultPackage
from .question_answering import QuestionAnswerResultPackage, QuestionAnswerSpanClassificationResultPackage
from .summarization import TextSummarizationResultPackage
from .translation import MachineTranslationResultPackage

__all__ = ['QuestionAnswerResultPackage', 'QuestionAnswerSpanClassificationResultPackage',
           'TextSummarizationResultPackage', 'MachineTranslationResultPackage', 'GLUEResultPackage',
           'XNLIResultPackage']
