"""A token vocabulary (AIToolbox's ``aitoolbox.nlp.core.vocabulary.Vocabulary``): words to indices and back, with
the reserved tokens PAD 0, OOV 1, SOS 2, EOS 3 (and SOD 4, EOD 5 for document-level vocabularies)."""
import logging
from typing import Any, Dict, Iterable, List

logger = logging.getLogger(__name__)

__all__ = ['Vocabulary']


class Vocabulary:
    """Words to indices and back; the words get indices in the order they are first added, after the reserved ones."""

    def __init__(self, name: str, document_level: bool = False) -> None:
        """Vocabulary used for storing the tokens and converting between the indices and the tokens

        Args:
            name (str): name of the vocabulary (for the user's bookkeeping)
            document_level (bool): the texts are documents of several sentences: two more reserved tokens mark the
                start (``SOD``, 4) and the end (``EOD``, 5) of a document
        """
        self.PAD_token = 0  # padding of short sentences
        self.OOV_token = 1  # a word not in the vocabulary
        self.SOS_token = 2  # start of sentence
        self.EOS_token = 3  # end of sentence
        self.SOD_token = 4  # start of document (document_level only)
        self.EOD_token = 5  # end of document (document_level only)

        self.name = name
        self.document_level = document_level
        self.trimmed = False
        self.word2index: Dict[str, int] = {}
        self.word2count: Dict[str, int] = {}
        self.index2word: Dict[int, str] = {}
        self.default_tokens: List[int] = []
        self.num_words = 0
        self._reset_words()

    def _reserved(self) -> Dict[int, str]:
        reserved = {self.PAD_token: 'PAD', self.OOV_token: 'OOV', self.SOS_token: 'SOS', self.EOS_token: 'EOS'}
        if self.document_level:
            reserved.update({self.SOD_token: 'SOD', self.EOD_token: 'EOD'})
        return reserved

    def _reset_words(self) -> None:
        reserved = self._reserved()
        self.word2index = {}
        self.word2count = {}
        self.index2word = dict(reserved)
        self.default_tokens = list(reserved)
        self.num_words = len(reserved)

    def add_sentence(self, sentence_tokens: Iterable[Any]) -> None:
        """Add each token of a tokenised sentence (converted with ``str``) to the vocabulary

        Args:
            sentence_tokens (list): the sentence's tokens, e.g. its words
        """
        for word in sentence_tokens:
            self.add_word(str(word))

    def add_word(self, word: str) -> None:
        """Add one word: a new word gets the next free index, a known one has its count increased

        Args:
            word (str): the word
        """
        if word in self.word2index:
            self.word2count[word] += 1
            return
        self.word2index[word] = self.num_words
        self.word2count[word] = 1
        self.index2word[self.num_words] = word
        self.num_words += 1

    def trim(self, min_count: int) -> None:
        """Drop the words seen fewer than ``min_count`` times; the others get new indices in their original order
        (their counts are kept). A vocabulary is trimmed once: later calls do nothing.

        Args:
            min_count (int): the fewest times a word must have been added to stay
        """
        if self.trimmed:
            return
        self.trimmed = True
        kept = {word: count for word, count in self.word2count.items() if count >= min_count}
        before = len(self.word2index)
        logger.info('Vocabulary %r: keeping %d of %d words (%.4f) seen at least %d times', self.name, len(kept),
                    before, len(kept) / before if before else 1.0, min_count)
        self._reset_words()
        for word, count in kept.items():
            self.add_word(word)
            self.word2count[word] = count

    def convert_sent2idx_sent(self, sent_tokens: Iterable[str], start_end_token: bool = True) -> List[int]:
        """The indices of a tokenised sentence; an unknown word becomes ``OOV_token``

        Args:
            sent_tokens (list): the sentence's tokens
            start_end_token (bool): put ``SOS_token`` before and ``EOS_token`` after the sentence

        Returns:
            list: the indices

        Raises:
            ValueError: the vocabulary has no words yet
        """
        if not self.word2index:
            raise ValueError(f'Vocabulary {self.name!r} has no words yet: add_sentence() first')
        indices = [self.word2index.get(word, self.OOV_token) for word in sent_tokens]
        if start_end_token:
            return [self.SOS_token, *indices, self.EOS_token]
        return indices

    def convert_idx_sent2sent(self, idx_sent: Iterable[Any], rm_default_tokens: bool = False) -> List[str]:
        """The tokens of a sentence of indices (Python or numpy integers, or the elements of an integer tensor)

        Args:
            idx_sent: the indices
            rm_default_tokens (bool): leave out the reserved tokens (padding, start and end markers, OOV)

        Returns:
            list: the tokens

        Raises:
            KeyError: an index that is not in the vocabulary
        """
        indices = [int(index) for index in idx_sent]
        if rm_default_tokens:
            reserved = set(self.default_tokens)
            indices = [index for index in indices if index not in reserved]
        return [self.index2word[index] for index in indices]
