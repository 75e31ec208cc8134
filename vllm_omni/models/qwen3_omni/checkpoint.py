"""Load a Qwen3-Omni checkpoint (local folder or local HF cache) for the orchestrator.

With every stage on torch, the whole model is loaded. When vLLM engines serve both the
thinker and the talker, their weights live in those engines; the orchestrator process then
loads only what it runs itself: code2wav and the small modules the thinker-to-talker
bridge uses (the thinker's token embedding, the talker's codec embedding and its two
projections), read selectively from the safetensors files. For the 30B checkpoint that is
about 1.5 GB instead of the whole model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from transformers import (
    AutoImageProcessor,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeForConditionalGeneration,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCode2Wav,
    Qwen3OmniMoeTalkerResizeMLP,
)

from vllm_omni.models.checkpoint_dir import local_checkpoint_dir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Qwen3OmniCheckpoint:
    """The loaded modules; each stage uses its own part. With `bridge_only` loading,
    `thinker` and `talker` hold just the bridge's modules (see `BridgeModules`)."""

    path: str
    config: Qwen3OmniMoeConfig
    tokenizer: PreTrainedTokenizerBase
    thinker: nn.Module
    talker: nn.Module
    code2wav: nn.Module
    model: Qwen3OmniMoeForConditionalGeneration | None = None  # the whole model, when loaded
    image_processor: Any = None  # the checkpoint's saved image processor; None if it has none (images.py)


class BridgeModules(nn.Module):
    """The part of a thinker or talker the orchestrator needs when the stage itself runs
    in a vLLM engine: its input embedding and, for the talker, the two projections."""

    def __init__(self, embeddings: nn.Embedding, **projections: nn.Module):
        super().__init__()
        self.embeddings = embeddings
        for name, module in projections.items():
            self.add_module(name, module)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    @property
    def dtype(self) -> torch.dtype:
        return self.embeddings.weight.dtype


def _read_tensors(folder: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The stored tensors whose names start with one of `prefixes` (other shards unopened)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({file for name, file in weight_map.items() if name.startswith(prefixes)})
    else:
        files = [path.name for path in sorted(folder.glob("*.safetensors"))]
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(folder / file), "pt") as stored:
            names = [name for name in stored.keys() if name.startswith(prefixes)]  # noqa: SIM118 (not a dict)
            tensors.update({name: stored.get_tensor(name) for name in names})
    return tensors


def _loaded(module: nn.Module, tensors: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> nn.Module:
    state = {name[len(prefix):]: tensor for name, tensor in tensors.items() if name.startswith(prefix)}
    module.load_state_dict(state, strict=True)
    return module.to(dtype).eval()


def _load_bridge_only(folder: Path, config: Qwen3OmniMoeConfig, dtype: torch.dtype
                      ) -> tuple[nn.Module, nn.Module, nn.Module]:
    tensors = _read_tensors(folder, ("thinker.model.embed_tokens.", "talker.model.codec_embedding.",
                                     "talker.text_projection.", "talker.hidden_projection.", "code2wav."))
    thinker_text, talker_config = config.thinker_config.text_config, config.talker_config
    talker_text = talker_config.text_config
    thinker = BridgeModules(_loaded(nn.Embedding(thinker_text.vocab_size, thinker_text.hidden_size), tensors,
                                    "thinker.model.embed_tokens.", dtype))
    talker = BridgeModules(
        _loaded(nn.Embedding(talker_text.vocab_size, talker_text.hidden_size), tensors,
                "talker.model.codec_embedding.", dtype),
        text_projection=_loaded(Qwen3OmniMoeTalkerResizeMLP(talker_config), tensors, "talker.text_projection.", dtype),
        hidden_projection=_loaded(Qwen3OmniMoeTalkerResizeMLP(talker_config), tensors, "talker.hidden_projection.",
                                  dtype))
    code2wav = _loaded(Qwen3OmniMoeCode2Wav._from_config(config.code2wav_config), tensors, "code2wav.", dtype)
    return thinker, talker, code2wav


def saved_image_processor(path: str | Path) -> Any:
    """The checkpoint's saved image processor, or None if it ships none (it then takes no images)."""
    try:
        return AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
    except OSError:
        return None


def load_checkpoint(path: str | Path, dtype: str = "float32", bridge_only: bool = False) -> Qwen3OmniCheckpoint:
    """Load weights, tokenizer and image processor with no network access
    (`local_files_only`); `bridge_only` when the thinker and the talker run in vLLM engines."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (expected one of {', '.join(DTYPES)})")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    image_processor = saved_image_processor(path)
    if bridge_only:
        folder = local_checkpoint_dir(path)
        config = Qwen3OmniMoeConfig.from_pretrained(str(folder), local_files_only=True)
        if not config.enable_audio_output:
            raise ValueError(f"{path}: checkpoint has no talker (enable_audio_output is false)")
        thinker, talker, code2wav = _load_bridge_only(folder, config, DTYPES[dtype])
        return Qwen3OmniCheckpoint(path=str(path), config=config, tokenizer=tokenizer, thinker=thinker,
                                   talker=talker, code2wav=code2wav, image_processor=image_processor)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(path), dtype=DTYPES[dtype], local_files_only=True).eval()
    if not model.has_talker:
        raise ValueError(f"{path}: checkpoint has no talker (enable_audio_output is false)")
    return Qwen3OmniCheckpoint(path=str(path), config=model.config, tokenizer=tokenizer, thinker=model.thinker,
                               talker=model.talker, code2wav=model.code2wav, model=model,
                               image_processor=image_processor)
