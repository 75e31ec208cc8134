"""Moshi's inner-monologue text stream: between words it emits padding, which says nothing
(docs/moshi.md, "Frames on the wire")."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

PAD_ID = 3  # "<pad>": nothing said in this frame
EPAD_ID = 0  # the padding that ends a pause, just before a word
SILENT_TEXT_IDS = frozenset({PAD_ID, EPAD_ID})


class TextPieces:
    """Text token ids as the text they add to a transcript (sentencepiece's "▁" is a space)."""

    def __init__(self, checkpoint: str | Path):
        self._tokenizer = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))

    def piece(self, token: int) -> str:
        if token in SILENT_TEXT_IDS:
            return ""
        text = self._tokenizer.id_to_token(token) or ""
        return text.replace("▁", " ")

