"""Incremental detokenization: text deltas that never split a multi-byte character."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""

    def add(self, token_id: int) -> str:
        """Add a token; return the new text it completes (possibly empty)."""
        self.token_ids.append(token_id)
        decoded = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if decoded.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more tokens
            return ""
        delta, self.text = decoded[len(self.text):], decoded
        return delta
