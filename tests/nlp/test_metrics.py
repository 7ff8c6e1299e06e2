"""aitoolbox_like.nlp's metrics against their oracles, each named in its test: AIToolbox 1.8.0's own values (the
expectations of its tests/test_nlp/test_experiment_evaluation/test_NLP_metrics.py, which its code passed while it
still imported), nltk, rouge-score's published example, a BLEU computed by hand from its definition, and
scikit-learn / scipy for GLUE."""
import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from nltk.translate.bleu_score import corpus_bleu, sentence_bleu
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from aitoolbox_like.nlp import (AttentionHeatMap, BLEUCorpusScoreMetric, BLEUScoreStrTorchNLPMetric,
                                BLEUSentenceScoreMetric, ExactMatchTextMetric, F1TextMetric, GLUEMetric,
                                PerplexityMetric, ROUGEMetric, ROUGEPerlMetric, XNLIMetric, glue_compute_metrics,
                                xnli_compute_metrics)


def split(*sentences):
    return [sentence.split() for sentence in sentences]


def test_rouge_is_rouge_score_s_published_example():
    # rouge-score's README: 'The quick brown fox jumps over the lazy dog' against 'The quick brown dog jumps on the
    # log.', stemmed: rouge1 P 0.75 R 0.6667 F 0.7059, rougeL P 0.625 R 0.5556 F 0.5882
    rouge = ROUGEMetric(split('The quick brown fox jumps over the lazy dog'),
                        split('The quick brown dog jumps on the log.'), use_stemmer=True).get_metric()
    assert rouge['rouge-1'] == pytest.approx({'p': 0.75, 'r': 2 / 3, 'f': 0.7058823529411765})
    assert rouge['rouge-l'] == pytest.approx({'p': 0.625, 'r': 5 / 9, 'f': 0.5882352941176471})


def test_rouge_equals_aitoolbox_s_values_to_their_epsilon():
    # AIToolbox's rouge package added 1e-8 to the F-score's denominator (0.5999999950000001 for 0.6)
    rouge = ROUGEMetric(split('Today the sun shines not'), split('Today the sun does shine'))
    expected = {'rouge-1': {'f': 0.5999999950000001, 'p': 0.6, 'r': 0.6},
                'rouge-2': {'f': 0.4999999950000001, 'p': 0.5, 'r': 0.5},
                'rouge-l': {'f': 0.5999999950000001, 'p': 0.6, 'r': 0.6}}
    for name, parts in expected.items():
        assert rouge.get_metric()[name] == pytest.approx(parts, abs=1e-8)
    assert rouge.get_metric_dict() == {'ROGUE': rouge.get_metric()}
    actual_text = ROUGEMetric(['Today the sun shines not'], split('Today the sun does shine'), target_actual_text=True)
    assert actual_text.get_metric() == rouge.get_metric()
    nothing_shared = ROUGEMetric(split('today we go to the university'), split('bla mjav how w!?'))
    assert all(value == 0.0 for parts in nothing_shared.get_metric().values() for value in parts.values())


def test_rouge_averages_over_pairs_and_writes_the_answers(tmp_path):
    both = ROUGEMetric(split('a b c', 'x y'), split('a b c', 'q r'), output_text_dir=str(tmp_path / 'answers'))
    assert both.get_metric()['rouge-1'] == {'f': 0.5, 'p': 0.5, 'r': 0.5}
    assert (tmp_path / 'answers' / 'answer_pred_true_1.txt').read_text() == \
        'Answer to question 1:\nPredicted:\tq r\nTrue:\tx y\n'


def test_exact_match_and_f1_are_aitoolbox_s():
    true = split('bla bla bla', 'bla NON dasdadad dqewq', 'bla blla', 'Today is sunny')
    pred = split('bla bla bla', 'bla bla bla', 'uuuu', 'Today is Not sunny')
    assert ExactMatchTextMetric(true, pred).get_metric() == 25.
    assert F1TextMetric(true, pred).get_metric() == 53.57142857142857
    assert F1TextMetric(split('bla bla bla', 'bla NON bla'), split('bla bla bla', 'bla bla bla')).get_metric() == \
        83.33333333333333
    # SQuAD's normalisation: case, punctuation and articles do not count
    assert ExactMatchTextMetric(['The Eiffel Tower!'], split('eiffel tower'), target_actual_text=True).get_metric() \
        == 100.
    with pytest.raises(ValueError, match='one predicted answer per question'):
        F1TextMetric(split('a'), split('a', 'b'))


@pytest.mark.filterwarnings('ignore::UserWarning:nltk.translate.bleu_score')
def test_bleu_sentence_and_corpus_are_nltk_s_and_aitoolbox_s():
    true = split('bla bla bla bla', 'mjaw how how how how mjav mjaw')
    pred = split('bla mjav bla bla bla', 'mjaw how how mjav mjaw')
    sentence = BLEUSentenceScoreMetric(true, pred)
    corpus = BLEUCorpusScoreMetric(true, pred)
    assert sentence.get_metric() == np.mean([sentence_bleu([t], p) for t, p in zip(true, pred)])
    assert corpus.get_metric() == corpus_bleu([[t] for t in true], pred)
    # AIToolbox 1.8.0's values for the same sentences
    assert sentence.get_metric() == pytest.approx(0.281834861892037)
    assert corpus.get_metric() == pytest.approx(0.5240330551337333)
    assert BLEUSentenceScoreMetric(split('Today the sun does not shine'),
                                   split('Today the sun does shine')).get_metric() == pytest.approx(0.5789300674674098)
    assert sentence.get_metric_dict() == {'BLEU_sentence_score': sentence.get_metric()}
    with pytest.raises(ValueError):
        BLEUCorpusScoreMetric(true, pred[:1])
    with pytest.raises(ValueError, match='source_sents'):
        BLEUSentenceScoreMetric(true, pred, output_text_dir='somewhere')


def moses_bleu(hypothesis, reference):
    """BLEU of one sentence from its definition (multi-bleu.perl: clipped 1-4-gram precisions, no smoothing, brevity
    penalty), in percent: the oracle written independently of sacrebleu."""
    log_precisions = []
    for n in range(1, 5):
        hyp = Counter(tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1))
        ref = Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1))
        matched = sum((hyp & ref).values())
        if matched == 0:
            return 0.0
        log_precisions.append(math.log(matched / sum(hyp.values())))
    brevity = min(0.0, 1 - len(reference) / len(hypothesis))
    return 100 * math.exp(brevity + sum(log_precisions) / 4)


def test_moses_bleu_is_the_prediction_against_the_reference():
    true = split('Today the sun does not shine', 'mjaw how how how how mjav mjaw', 'bla bla')
    pred = split('Today the sun does shine', 'mjaw how how mjav mjaw', 'bla bla')
    metric = BLEUScoreStrTorchNLPMetric(true, pred)
    per_sentence = [moses_bleu(p, t) for t, p in zip(true, pred)]
    assert metric.get_metric() == pytest.approx(np.mean(per_sentence))
    assert per_sentence[0] == pytest.approx(57.893, abs=1e-3)      # hypothesis shorter: brevity penalty applies
    # symmetric cases equal AIToolbox's (its multi-bleu.perl printout, two decimals)
    assert round(BLEUScoreStrTorchNLPMetric(split('Today the sun does shines'),
                                            split('Today the sun does shine')).get_metric(), 2) == 66.87
    assert BLEUScoreStrTorchNLPMetric(split('The Dog barks'), split('the dog barks'), lowercase=True).get_metric() \
        == 0.0   # three words: no 4-gram, so 0 as multi-bleu.perl gives
    assert BLEUScoreStrTorchNLPMetric(split('The Dog barks at me'), split('the dog barks at me'),
                                      lowercase=True).get_metric() == pytest.approx(100.0)


def test_perplexity_is_e_to_the_mean_loss():
    assert PerplexityMetric([1.0, 2.0]).get_metric() == pytest.approx(math.exp(1.5))
    assert PerplexityMetric(0.5).get_metric() == pytest.approx(math.exp(0.5))
    with pytest.raises(ValueError, match='no losses'):
        PerplexityMetric([])


def test_glue_and_xnli_are_transformers_4_s_definitions():
    labels, preds = np.array([0, 1, 1, 0, 1, 0]), np.array([0, 1, 0, 0, 1, 1])
    acc = float((preds == labels).mean())
    f1 = f1_score(labels, preds)
    assert glue_compute_metrics('mrpc', preds, labels) == pytest.approx({'acc': acc, 'f1': f1,
                                                                        'acc_and_f1': (acc + f1) / 2})
    assert glue_compute_metrics('cola', preds, labels) == {'mcc': matthews_corrcoef(labels, preds)}
    assert glue_compute_metrics('mnli-mm', preds, labels) == {'mnli-mm/acc': acc}
    scores, gold = np.array([0.1, 2.0, 3.5, 4.0]), np.array([0.0, 2.5, 3.0, 5.0])
    pearson, spearman = pearsonr(scores, gold)[0], spearmanr(scores, gold)[0]
    assert glue_compute_metrics('sts-b', scores, gold) == pytest.approx(
        {'pearson': pearson, 'spearmanr': spearman, 'corr': (pearson + spearman) / 2})
    assert xnli_compute_metrics('xnli', preds, labels) == {'acc': acc}
    with pytest.raises(KeyError, match='not a GLUE task'):
        glue_compute_metrics('squad', preds, labels)
    # AIToolbox's metric classes: '/' in the names becomes '_'
    assert GLUEMetric(labels, preds, 'mnli').get_metric_dict() == {'GLUE_mnli': {'mnli_acc': acc}}
    assert XNLIMetric(labels, preds).get_metric_dict() == {'xnli_accuracy': {'acc': acc}}


def test_perl_rouge_is_refused_clearly_without_perl_or_pyrouge(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'pyrouge', None)      # not installed, whatever this machine has
    with pytest.raises(ImportError, match=r'pip install .*pyrouge.*ROUGEMetric'):
        ROUGEPerlMetric(split('a b'), split('a b'), str(tmp_path / 'texts'))
    monkeypatch.setenv('PATH', str(tmp_path))              # no perl on the PATH
    with pytest.raises(RuntimeError, match='no perl on the PATH.*ROUGEMetric'):
        ROUGEPerlMetric(split('a b'), split('a b'), str(tmp_path / 'texts'))
    assert not (tmp_path / 'texts').exists()               # refused before writing anything


def test_a_missing_dependency_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, 'rouge_score', None)
    monkeypatch.setitem(sys.modules, 'rouge_score.rouge_scorer', None)
    with pytest.raises(ImportError,
                       match=r'ROUGEMetric needs the rouge-score package.*pip install "aitoolbox_like\[nlp\]"'):
        ROUGEMetric(split('a'), split('a'))


def test_importing_the_train_loop_loads_no_nlp():
    code = ('import sys; from aitoolbox_like import TrainLoop; '
            'print(sorted(m for m in sys.modules if m.split(".")[0] in ("nltk", "rouge_score", "sacrebleu")'
            ' or m.startswith("aitoolbox_like.nlp")))')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[]'


def test_attention_heat_maps_take_the_model_s_padded_tensor(tmp_path):
    # one (steps, source tokens) matrix per sentence, padded beyond the sentences, straight from a model
    attention = torch.softmax(torch.randn(2, 6, 8, requires_grad=True), dim=2)
    heat_maps = AttentionHeatMap(attention, [['a', 'b', 'c'], ['x'] * 8], [['u', 'v'], ['w'] * 6],
                                 str(tmp_path / 'plots'))
    assert heat_maps.get_metric() == [str(tmp_path / 'plots' / 'attention_heatmaps' / f'attn_plot_{i}.png')
                                      for i in range(2)]
    assert all(open(path, 'rb').read(4) == b'\x89PNG' for path in heat_maps.get_metric())
    figure = AttentionHeatMap.plot_sentence_attention(attention[0, :2].detach().numpy(), ['a', 'b', 'c'], ['u', 'v'])
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == ['a', 'b', 'c']
    assert [label.get_text() for label in axes.get_yticklabels()] == ['u', 'v']
    with pytest.raises(ValueError, match='differ in length'):
        AttentionHeatMap(attention, [['a']], [['u'], ['v']], str(tmp_path / 'other'))
