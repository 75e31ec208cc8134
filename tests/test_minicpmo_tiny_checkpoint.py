"""The tiny MiniCPM-o 4.5 checkpoint: the real architecture's config, tokenizer and key names,
deterministic, and loaded by vLLM's own MiniCPM-o 4.5 model with no remote code."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer, Qwen3ForCausalLM

from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.tiny.checkpoint import (
    WEIGHTS_FILE,
    MiniCPMOWeights,
    build_tiny_checkpoint,
    build_weights,
)
from vllm_omni.models.minicpmo.tiny.config import tiny_config
from vllm_omni.models.minicpmo.tokenizer import MiniCPMOTokenizer

# Ids of the duplex loop's tokens in the real tokenizer (docs/minicpmo.md, "Special tokens").
REAL_IDS = {"<unit>": 151683, "</unit>": 151684, "<|listen|>": 151705, "<|speak|>": 151706,
            "<|chunk_eos|>": 151718, "<|chunk_tts_eos|>": 151721, "<|turn_eos|>": 151717, "<|tts_bos|>": 151703,
            "<|tts_eos|>": 151704, "<|tts_pad|>": 151722, "<|audio_start|>": 151697, "<|audio|>": 151698,
            "<|audio_end|>": 151699, "<image>": 151669, "</image>": 151670, "<slice>": 151679,
            "</slice>": 151680, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|endoftext|>": 151643,
            "<unk>": 128244, "<|timbre_31|>": 151747}
CHAT_PROMPT = [151644, 872, 198, 71, 68, 75, 75, 78, 151645, 198, 151644, 77091, 198]  # user "hello", then assistant


@pytest.fixture(scope="module")
def checkpoint(minicpmo_checkpoint: Path) -> Path:
    return minicpmo_checkpoint


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_config_and_tokenizer_load_as_the_real_checkpoints_do(checkpoint: Path) -> None:
    config = AutoConfig.from_pretrained(checkpoint)
    assert isinstance(config, MiniCPMOConfig) and "auto_map" not in json.loads((checkpoint / "config.json").read_text())
    assert (config.model_type, config.version, config.architectures) == ("minicpmo", "4.5", ["MiniCPMO"])
    assert config.hidden_size % 128 == 0 and config.head_dim >= 32
    assert config.audio_config.encoder_ffn_dim == 4 * config.audio_config.d_model
    assert config.tts_config.llm_dim == config.hidden_size and config.tts_config.num_text_tokens == config.vocab_size
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert isinstance(tokenizer, MiniCPMOTokenizer) and len(tokenizer) == config.vocab_size
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in REAL_IDS} == REAL_IDS
    assert (tokenizer.audio_start_id, tokenizer.slice_start_id, tokenizer.spk_start_id) == (151697, 151679, 151700)
    assert tokenizer.decode(tokenizer.encode("<unit>hello</unit>")) == "<unit>hello</unit>"
    assert tokenizer.bad_token_ids == [7, 8, 94, 95, 96]
    preprocessor = json.loads((checkpoint / "preprocessor_config.json").read_text())
    assert (preprocessor["image_feature_size"], preprocessor["audio_pool_step"], preprocessor["version"]) == \
        (64, 5, "4.5")


def test_every_weight_has_its_real_key_name_and_shape(checkpoint: Path) -> None:
    config = AutoConfig.from_pretrained(checkpoint)
    state = load_file(checkpoint / WEIGHTS_FILE)
    MiniCPMOWeights(config).load_state_dict(state, strict=True)
    assert {name.split(".")[0] for name in state} == {"llm", "vpm", "resampler", "apm", "audio_projection_layer",
                                                      "tts"}
    width, vision = config.hidden_size, config.vision_config.hidden_size
    shapes = {"resampler.query": (64, width), "resampler.kv_proj.weight": (width, vision),
              "resampler.proj": (width, width), "audio_projection_layer.linear1.weight": (width, 64),
              "tts.emb_text.weight": (config.vocab_size, 64), "tts.emb_code.0.weight": (6562, 64),
              "tts.head_code.0.parametrizations.weight.original0": (6562, 1),
              "tts.projector_semantic.linear1.weight": (64, width), "llm.lm_head.weight": (config.vocab_size, width)}
    assert {name: tuple(state[name].shape) for name in shapes} == shapes
    kept_layers = {name.split(".")[3] for name in state if name.startswith("vpm.encoder.layers.")}
    assert kept_layers == {"0"}  # drop_vision_last_layer: 2 layers configured, the last one unused


def test_the_same_seed_gives_the_same_bytes(checkpoint: Path, tmp_path: Path) -> None:
    again = build_tiny_checkpoint(tmp_path / "again", seed=0)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert sha256(again / name) == sha256(checkpoint / name), name
    seed_0 = load_file(checkpoint / WEIGHTS_FILE)
    seed_1 = build_weights(tiny_config(), seed=1).state_dict()
    assert not torch.equal(seed_1["apm.conv1.weight"], seed_0["apm.conv1.weight"])


def test_vllm_serves_it_without_remote_code_as_transformers_computes_it(checkpoint: Path) -> None:
    """vLLM resolves `minicpmo` through our plugin's config and tokenizer classes, builds its own
    MiniCPM-o 4.5 model, loads every weight by its key name, and its language model answers as
    transformers' Qwen3 does on the same weights (greedy, float32)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    config = AutoConfig.from_pretrained(checkpoint)
    reference = Qwen3ForCausalLM(config).eval()
    reference.load_state_dict({name[len("llm."):]: tensor for name, tensor in load_file(checkpoint / WEIGHTS_FILE)
                               .items() if name.startswith("llm.")}, strict=True)
    prompt = torch.tensor([CHAT_PROMPT])
    expected = reference.generate(prompt, max_new_tokens=6, do_sample=False)[0, prompt.shape[1]:].tolist()

    llm = LLM(model=str(checkpoint), dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
              trust_remote_code=False, limit_mm_per_prompt={"image": 0, "audio": 0, "video": 0})
    try:
        assert type(llm.llm_engine.model_config.hf_config).__name__ == "MiniCPMOConfig"
        output = llm.generate(TokensPrompt(prompt_token_ids=CHAT_PROMPT), SamplingParams(temperature=0, max_tokens=6))
        assert list(output[0].outputs[0].token_ids) == expected
    finally:
        llm.llm_engine.engine_core.shutdown()
