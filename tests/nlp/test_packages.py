"""aitoolbox_like.nlp's result packages: each package's results are its metrics computed directly on the texts it is
meant to score (the spans cut out of the paragraphs, the token ids turned back into words)."""
import math
import os

import numpy as np
import pytest
import torch

from aitoolbox_like.nlp import (BLEUCorpusScoreMetric, BLEUSentenceScoreMetric, ExactMatchTextMetric, F1TextMetric,
                                GLUEResultPackage, MachineTranslationResultPackage, QuestionAnswerResultPackage,
                                QuestionAnswerSpanClassificationResultPackage, ROUGEMetric,
                                TextSummarizationResultPackage, Vocabulary, XNLIResultPackage)

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning:nltk.translate.bleu_score')

PARAGRAPHS = [['the', 'cat', 'sat', 'on', 'the', 'mat'], ['dogs', 'bark', 'at', 'night', 'loudly']]
TRUE_SPANS = np.array([[1, 2], [0, 3]])
PRED_SPANS = np.array([[1, 1], [0, 3]])


def test_question_answering_scores_the_answers_cut_out_by_the_spans(tmp_path):
    package = QuestionAnswerResultPackage(PARAGRAPHS, output_text_dir=str(tmp_path / 'answers'))
    package.prepare_result_package(TRUE_SPANS, PRED_SPANS)
    true_text = [['cat', 'sat'], ['dogs', 'bark', 'at', 'night']]
    pred_text = [['cat'], ['dogs', 'bark', 'at', 'night']]
    results = package.get_results()
    assert results == {'ROGUE': ROUGEMetric(true_text, pred_text).get_metric(),
                       'EM': ExactMatchTextMetric(true_text, pred_text).get_metric(),
                       'F1': F1TextMetric(true_text, pred_text).get_metric()}
    assert results['EM'] == 50. and results['F1'] == pytest.approx(100 * (2 / 3 + 1) / 2)
    assert sorted(os.listdir(tmp_path / 'answers')) == ['answer_pred_true_0.txt', 'answer_pred_true_1.txt']
    [[zip_name, zip_path]] = package.get_additional_results_dump_paths()
    assert zip_name == 'answers.zip' and os.path.isfile(zip_path)

    flat = QuestionAnswerResultPackage(PARAGRAPHS, target_actual_text=['cat sat', 'dogs bark at night'],
                                       flatten_result_dict=True)
    flat.prepare_result_package(TRUE_SPANS, PRED_SPANS)
    assert flat.get_results()['ROGUE_rouge-1_f'] == results['ROGUE']['rouge-1']['f']
    assert flat.get_results()['EM'] == 50.
    with pytest.raises(ValueError, match='output_text_dir'):
        QuestionAnswerResultPackage(PARAGRAPHS, use_perl_rouge=True)


def test_span_classification_is_start_and_end_accuracy():
    package = QuestionAnswerSpanClassificationResultPackage()
    package.prepare_result_package(TRUE_SPANS, PRED_SPANS)
    assert package.get_results() == {'Accuracy_span_start': 1.0, 'Accuracy_span_end': 0.5}


def test_summarization_is_rouge_of_the_summaries_in_words():
    vocab = Vocabulary('summaries')
    vocab.add_sentence('the cat sat on a mat'.split())
    true_ids = torch.tensor([vocab.convert_sent2idx_sent('the cat sat'.split()) + [0]])
    pred_ids = torch.tensor([vocab.convert_sent2idx_sent('the cat sat on'.split())])
    package = TextSummarizationResultPackage(target_vocab=vocab)
    package.prepare_result_package(true_ids, pred_ids)
    rouge = ROUGEMetric([['the', 'cat', 'sat']], [['the', 'cat', 'sat', 'on']]).get_metric()
    assert package.get_results()['ROGUE_rouge-1_p'] == rouge['rouge-1']['p'] == 0.75
    assert package.get_results()['ROGUE_rouge-l_f'] == rouge['rouge-l']['f']
    words = TextSummarizationResultPackage()
    words.prepare_result_package([['the', 'cat', 'sat']], [['the', 'cat', 'sat', 'on']])
    assert words.get_results() == package.get_results()


def test_machine_translation_bleu_perplexity_and_heat_maps(tmp_path):
    vocab = Vocabulary('de')
    vocab.add_sentence('der hund bellt laut'.split())
    source_vocab = Vocabulary('en')
    source_vocab.add_sentence('the dog barks loudly'.split())
    true = torch.tensor([vocab.convert_sent2idx_sent('der hund bellt laut'.split()),
                         vocab.convert_sent2idx_sent('der hund'.split()) + [0, 0]])
    pred = torch.tensor([vocab.convert_sent2idx_sent('der hund bellt'.split()) + [0],
                         vocab.convert_sent2idx_sent('der hund'.split()) + [0, 0]])
    source = torch.tensor([source_vocab.convert_sent2idx_sent('the dog barks loudly'.split())] * 2)
    attention = torch.softmax(torch.randn(2, 6, 6), dim=2)
    package = MachineTranslationResultPackage(vocab, source_vocab=source_vocab,
                                              output_attn_heatmap_dir=str(tmp_path / 'attention'))
    assert package.requires_loss
    # as ModelPerformanceEvaluation passes them: the loss and the model's prediction metadata
    package.prepare_result_package(true, pred, additional_results={
        'loss': 0.7, 'attention_matrices': attention, 'source_sent_text': source})
    true_words, pred_words = [['der', 'hund', 'bellt', 'laut'], ['der', 'hund']], [['der', 'hund', 'bellt'],
                                                                                   ['der', 'hund']]
    results = package.get_results()
    assert results['BLEU_corpus_score'] == BLEUCorpusScoreMetric(true_words, pred_words).get_metric()
    assert results['BLEU_sentence_score'] == BLEUSentenceScoreMetric(true_words, pred_words).get_metric()
    assert results['Perplexity'] == pytest.approx(math.exp(0.7))
    plots = results['Attention_HeatMap']
    assert [os.path.basename(p) for p in plots] == ['attn_plot_0.png', 'attn_plot_1.png']
    assert all(open(p, 'rb').read(8) == b'\x89PNG\r\n\x1a\n' for p in plots)
    assert [name for name, _ in package.get_additional_results_dump_paths()] == ['attention.zip']


def test_machine_translation_says_what_it_misses():
    package = MachineTranslationResultPackage(Vocabulary('de'))
    package.prepare_result_package([[2, 3]], [[2, 3]])
    with pytest.raises(ValueError, match='needs the loss'):
        package.get_results()
    with pytest.raises(ValueError, match='source_vocab and source_sents'):
        MachineTranslationResultPackage(Vocabulary('de'), output_text_dir='texts')


def test_glue_and_xnli_packages_flatten_their_metrics():
    glue = GLUEResultPackage('mrpc')
    glue.prepare_result_package([0, 1, 1, 0], [0, 1, 0, 0])
    assert glue.get_results() == pytest.approx({'GLUE_mrpc_acc': 0.75, 'GLUE_mrpc_f1': 2 / 3,
                                                'GLUE_mrpc_acc_and_f1': (0.75 + 2 / 3) / 2})
    xnli = XNLIResultPackage()
    xnli.prepare_result_package([0, 1, 2, 2], [0, 1, 2, 1])
    assert xnli.get_results() == {'xnli_accuracy_acc': 0.75}
