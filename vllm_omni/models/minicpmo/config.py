"""MiniCPM-o 4.5's configuration, owned by this project (docs/minicpmo.md).

The checkpoint's own config class ships as remote code; these classes read the same
`config.json` fields so that transformers and vLLM load a MiniCPM-o folder without running
any code from it. `register_hf_classes` makes `model_type: minicpmo` known to transformers'
auto classes (our vLLM plugin calls it in every vLLM process).

The language model is Qwen3: its fields sit at the top level, as the checkpoint has them.
`vision_config` is SigLIP's, `audio_config` Whisper's (encoder fields), `tts_config` the
talker's (a Llama backbone with codec embeddings and heads).
"""

from __future__ import annotations

import contextlib
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig, Qwen3Config, SiglipVisionConfig, WhisperConfig

MODEL_TYPE = "minicpmo"
TTS_MODEL_TYPE = "minicpmtts"
VERSION = "4.5"


@strict
class MiniCPMTTSConfig(PreTrainedConfig):
    """The talker: a Llama decoder over text-conditioned rows and codec codes."""

    model_type = TTS_MODEL_TYPE

    backbone_model: str = "llama"
    hidden_size: int = 768
    intermediate_size: int = 3072
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    num_hidden_layers: int = 20
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    llm_dim: int = 4096  # the LLM's hidden size: the width of the hidden states it conditions on
    projector_type: str = "mlp"
    normalize_projected_hidden: bool = True
    num_audio_tokens: int = 6562  # codec vocabulary; the last id is the codec's end
    num_text_tokens: int = 152064  # rows of emb_text, indexed by LLM token ids
    num_vq: int = 1
    audio_bos_token_id: int = 151687
    text_eos_token_id: int = 151692
    attention_type: str = "full_attention"
    window_size: int = 2
    recomputed_chunks: int = 1
    audio_tokenizer_type: str = "s3tokenizer_step_audio"


@strict
class MiniCPMOConfig(Qwen3Config):
    model_type = MODEL_TYPE
    sub_configs = {"vision_config": SiglipVisionConfig, "audio_config": WhisperConfig, "tts_config": MiniCPMTTSConfig}

    version: str = VERSION
    query_num: int = 64  # resampler outputs per image or slice
    image_size: int = 448
    drop_vision_last_layer: bool = True
    batch_vision_input: bool = True
    use_image_id: bool = True
    vision_batch_size: int = 16
    audio_pool_step: int = 5  # encoder frames averaged into one LLM row: 50 frames/s → 10 rows/s
    audio_chunk_length: float = 1.0
    stream_input: bool = True
    listen_speak_type: str = "asr"
    init_vision: bool = True
    init_audio: bool = True
    init_tts: bool = True
    slice_config: dict[str, Any] | None = None
    vision_config: dict | PreTrainedConfig | None = None
    audio_config: dict | PreTrainedConfig | None = None
    tts_config: dict | PreTrainedConfig | None = None
    patch_size: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        self.vision_config = _sub_config(SiglipVisionConfig, self.vision_config)
        self.audio_config = _sub_config(WhisperConfig, self.audio_config)
        self.tts_config = _sub_config(MiniCPMTTSConfig, self.tts_config)
        if self.slice_config is None:
            self.slice_config = {"patch_size": 14, "max_slice_nums": 9, "scale_resolution": 448}
        self.patch_size = self.vision_config.patch_size
        super().__post_init__(**kwargs)


def _sub_config(kind: type[PreTrainedConfig], value: dict | PreTrainedConfig | None) -> PreTrainedConfig:
    if isinstance(value, kind):
        return value
    fields = {k: v for k, v in (value or {}).items() if k != "model_type"}
    return kind(**fields)


def register_hf_classes() -> None:
    """Make `model_type: minicpmo` (and the talker's) known to transformers' AutoConfig."""
    from transformers import AutoConfig

    for model_type, config_class in ((MODEL_TYPE, MiniCPMOConfig), (TTS_MODEL_TYPE, MiniCPMTTSConfig)):
        with contextlib.suppress(ValueError):  # already registered in this process
            AutoConfig.register(model_type, config_class)
