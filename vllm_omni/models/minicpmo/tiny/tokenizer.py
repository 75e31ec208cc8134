"""Tokenizer and preprocessor files of the tiny MiniCPM-o checkpoint, built locally.

The vocabulary is a byte-level BPE (models/byte_level_tokenizer.py) with every special token
at its real id and `<unk>` at 128244. `bad_token_ids` (ids duplex decoding never samples)
holds the first five ids of the real list: the real list is data of the checkpoint, not
something to rebuild.
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_omni.models.byte_level_tokenizer import byte_level_tokenizer
from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.tokenizer import SPECIAL_TOKEN_IDS, UNK, MiniCPMOTokenizer

BAD_TOKEN_IDS = [7, 8, 94, 95, 96]
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def build_tokenizer(vocab_size: int) -> MiniCPMOTokenizer:
    return byte_level_tokenizer(MiniCPMOTokenizer, vocab_size, SPECIAL_TOKEN_IDS, CHAT_TEMPLATE, unk_token=UNK,
                                bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                model_max_length=131072, bad_token_ids=BAD_TOKEN_IDS)


def preprocessor_config(config: MiniCPMOConfig) -> dict:
    """The image and audio front ends' settings, as the checkpoint's preprocessor_config.json has them."""
    slices = config.slice_config
    return {"max_slice_nums": slices["max_slice_nums"], "scale_resolution": slices["scale_resolution"],
            "patch_size": slices["patch_size"], "use_image_id": config.use_image_id,
            "image_feature_size": config.query_num, "im_start": "<image>", "im_end": "</image>",
            "slice_start": "<slice>", "slice_end": "</slice>", "unk": UNK, "im_id_start": "<image_id>",
            "im_id_end": "</image_id>", "slice_mode": True, "audio_pool_step": config.audio_pool_step,
            "norm_mean": [0.5, 0.5, 0.5], "norm_std": [0.5, 0.5, 0.5], "version": config.version}


def save_tokenizer_files(config: MiniCPMOConfig, out_dir: Path) -> None:
    build_tokenizer(config.vocab_size).save_pretrained(str(out_dir))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(config), indent=2) + "\n")
