"""aitoolbox_like.nlp's text helpers, Vocabulary and QA collate function. Expected values: AIToolbox 1.8.0's own
(the values its tests/test_nlp/test_core asserts, and its code's behaviour where no test pins it)."""
import pytest
import torch

from aitoolbox_like.nlp import (Vocabulary, find_sub_list, normalize_string, qa_concat_ctx_span_collate_fn, str2bool,
                                unicode_to_ascii)


def test_string_helpers_as_aitoolbox():
    assert normalize_string('For this purpose, we propose a 2-hierarchical 345 attention model to capture.') == \
        'for this purpose we propose a 2 hierarchical 345 attention model to capture .'
    assert normalize_string('  Ça   déjà vu?!  ') == 'ca deja vu ? !'
    assert normalize_string('Ça va', unicode_to_ascii_convert=False) == 'a va'   # ç is not ASCII: dropped
    assert unicode_to_ascii('Crème brûlée') == 'Creme brulee'
    assert [str2bool(w) for w in ('Yes', 'T', '1', 'no', 'F', '0')] == [True, True, True, False, False, False]
    with pytest.raises(ValueError, match='Boolean value expected'):
        str2bool('maybe')
    assert find_sub_list([1, 2, 3], [1, 1, 1, 5, 1, 2, 3, 5, 6, 7]) == (4, 6)
    assert find_sub_list([1, 1], [1, 1, 1, 5]) == (0, 1)
    assert find_sub_list([7, 7], [1, 5, 6, 7]) is None
    with pytest.raises(ValueError, match='longer'):
        find_sub_list(range(10), range(5))


def test_vocabulary_indices_round_trip_and_reserved_tokens():
    vocab = Vocabulary('en')
    vocab.add_sentence(['today', 'the', 'sun', 'shines', '.'])
    vocab.add_sentence(['the', 'sun', 'will', 'rain', '.'])
    assert vocab.word2index == {'today': 4, 'the': 5, 'sun': 6, 'shines': 7, '.': 8, 'will': 9, 'rain': 10}
    assert vocab.word2count['the'] == 2 and vocab.num_words == 11
    ids = vocab.convert_sent2idx_sent(['today', 'it', 'will', 'rain'])
    assert ids == [2, 4, 1, 9, 10, 3]
    assert vocab.convert_idx_sent2sent(ids) == ['SOS', 'today', 'OOV', 'will', 'rain', 'EOS']
    # token ids as a model returns them: a padded tensor row, reserved tokens dropped on request
    row = torch.tensor([2, 4, 9, 10, 3, 0, 0])
    assert vocab.convert_idx_sent2sent(row, rm_default_tokens=True) == ['today', 'will', 'rain']
    assert Vocabulary('doc', document_level=True).index2word == {0: 'PAD', 1: 'OOV', 2: 'SOS', 3: 'EOS', 4: 'SOD',
                                                                 5: 'EOD'}
    with pytest.raises(ValueError, match='no words yet'):
        Vocabulary('empty').convert_sent2idx_sent(['a'])


def test_trim_keeps_frequent_words_with_their_counts():
    vocab = Vocabulary('en')
    vocab.add_sentence('a b a c a b'.split())
    vocab.trim(2)
    assert vocab.word2index == {'a': 4, 'b': 5}
    assert vocab.word2count == {'a': 3, 'b': 2}
    assert vocab.index2word == {0: 'PAD', 1: 'OOV', 2: 'SOS', 3: 'EOS', 4: 'a', 5: 'b'}
    vocab.trim(3)      # once only, as in AIToolbox
    assert vocab.num_words == 6


def test_qa_collate_pads_paragraphs_and_questions():
    batch = [(torch.tensor([5, 6, 7]), torch.tensor([8]), [0, 1]),
             (torch.tensor([9]), torch.tensor([4, 4]), [0, 0])]
    paragraphs, paragraph_lengths, questions, question_lengths, spans = qa_concat_ctx_span_collate_fn(batch)
    assert paragraphs.tolist() == [[5, 6, 7], [9, 0, 0]] and paragraph_lengths.tolist() == [3, 1]
    assert questions.tolist() == [[8, 0], [4, 4]] and question_lengths.tolist() == [1, 2]
    assert spans.tolist() == [[0, 1], [0, 0]] and spans.dtype == torch.long
