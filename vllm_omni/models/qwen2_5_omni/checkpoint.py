"""Load a Qwen2.5-Omni checkpoint (local folder or local HF cache) for the torch backend.

Besides the weights, the checkpoint folder holds `spk_dict.pt`: per voice, the thinker token
that opens the talker's text track (`bos_token`), the DiT's speaker vector (`cond`) and its
reference mel (`ref_mel`). transformers' `from_pretrained` reads it into `speaker_map`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

from vllm_omni.models.checkpoint_dir import local_checkpoint_dir
from vllm_omni.models.qwen3_omni.checkpoint import DTYPES, saved_image_processor


@dataclass(frozen=True)
class Voice:
    text_bos_id: int  # thinker-vocabulary token opening the talker's text track in this voice
    conditioning: torch.Tensor  # [1, enc_emb_dim] speaker vector of the DiT (float32)
    reference_mel: torch.Tensor  # [1, frames, mel_dim] reference mel of the DiT (float32)


@dataclass
class Qwen25OmniCheckpoint:
    path: str
    config: Qwen2_5OmniConfig
    tokenizer: PreTrainedTokenizerBase
    thinker: nn.Module
    talker: nn.Module
    token2wav: nn.Module  # always float32, as transformers runs it
    voices: dict[str, Voice]  # by lower-case name
    image_processor: Any = None  # None if the checkpoint ships none (it then takes no images)

    @property
    def im_end_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids("<|im_end|>")


def load_checkpoint(path: str | Path, dtype: str = "float32") -> Qwen25OmniCheckpoint:
    """Weights, voices, tokenizer and image processor, with no network access."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    folder = local_checkpoint_dir(path)
    if not (folder / "spk_dict.pt").is_file():
        raise ValueError(f"{path}: checkpoint has no spk_dict.pt (the talker's voices)")
    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(
        str(folder), dtype=DTYPES[dtype], local_files_only=True).eval()
    if not model.has_talker:
        raise ValueError(f"{path}: checkpoint has no talker (enable_audio_output is false)")
    model.token2wav.float()
    voices = {name.lower(): Voice(int(params["bos_token"]), params["cond"].float().reshape(1, -1),
                                  params["ref_mel"].float().reshape(1, -1, params["ref_mel"].shape[-1]))
              for name, params in model.speaker_map.items()}
    return Qwen25OmniCheckpoint(path=str(path), config=model.config,
                                tokenizer=AutoTokenizer.from_pretrained(str(folder), local_files_only=True),
                                thinker=model.thinker, talker=model.talker, token2wav=model.token2wav,
                                voices=voices, image_processor=saved_image_processor(folder))
