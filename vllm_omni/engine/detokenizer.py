"""Incremental detokenization: text deltas that never split a multi-byte character.

Each step decodes only a short window (the tokens since the last emitted piece, plus the
piece before them for context), so the cost per token does not grow with the answer.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # tokens before this are already in `text`

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        """Add a token; return the new text it completes (possibly empty) and the ids of the
        tokens that text comes from (held-back tokens of a partial character included)."""
        self.token_ids.append(token_id)
        before = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        after = self._decode(self.token_ids[self._prefix_offset:])
        if len(after) <= len(before) or after.endswith("\ufffd"):  # nothing new, or a partial character
            return "", ()
        delta = after[len(before):]
        covered = tuple(self.token_ids[self._read_offset:])
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        self.text += delta
        return delta, covered
