"""Load a Qwen3-Omni checkpoint (local folder or local HF cache) for the torch backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Qwen3OmniCheckpoint:
    """The loaded modules; each stage uses its own part."""

    path: str
    config: Qwen3OmniMoeConfig
    model: Qwen3OmniMoeForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase

    @property
    def thinker(self):
        return self.model.thinker

    @property
    def talker(self):
        return self.model.talker

    @property
    def code2wav(self):
        return self.model.code2wav


def load_checkpoint(path: str | Path, dtype: str = "float32") -> Qwen3OmniCheckpoint:
    """Load weights and tokenizer with no network access (`local_files_only`)."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(path), dtype=DTYPES[dtype], local_files_only=True).eval()
    if not model.has_talker:
        raise ValueError(f"{path}: checkpoint has no talker (enable_audio_output is false)")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return Qwen3OmniCheckpoint(path=str(path), config=model.config, model=model, tokenizer=tokenizer)
