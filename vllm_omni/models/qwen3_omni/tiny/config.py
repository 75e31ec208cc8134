"""A tiny Qwen3-Omni-MoE configuration that instantiates every module on CPU.

Widths and depths are tiny; vocabulary sizes and special-token ids are the real
checkpoint's, so every id-dependent code path behaves as in production. Every LLM
attention uses head_dim 64 (vLLM's CPU attention needs at least 32).
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen3OmniMoeConfig

from vllm_omni.models.byte_level_tokenizer import QWEN_ROLE_WORD_IDS

# Real Qwen3-Omni-30B-A3B special-token ids (qwen3-omni-pipeline.md, "Token ids").
IM_START, IM_END = 151644, 151645
SYSTEM_WORD, USER_WORD, ASSISTANT_WORD = (QWEN_ROLE_WORD_IDS[role] for role in ("system", "user", "assistant"))
AUDIO_START, AUDIO_END, AUDIO_PAD = 151669, 151670, 151675
IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END = 151655, 151656, 151652, 151653
TTS_PAD, TTS_BOS, TTS_EOS = 151671, 151672, 151673
THINKER_VOCAB = 152064
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}

HEAD_DIM = 64


def _mrope() -> dict[str, Any]:
    # Interleaved M-RoPE; the three sections sum to head_dim / 2.
    return {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [12, 10, 10],
            "interleaved": True, "mrope_interleaved": True}


def _moe_text(vocab_size: int, num_layers: int) -> dict[str, Any]:
    return dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=1,
                head_dim=HEAD_DIM, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=4096,
                rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=_mrope())


def tiny_config_kwargs() -> dict[str, Any]:
    """Keyword arguments for `Qwen3OmniMoeConfig` describing the tiny checkpoint."""
    audio = dict(d_model=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=256,
                 output_dim=64, downsample_hidden_size=32, num_mel_bins=128,
                 max_source_positions=1500, n_window=50, n_window_infer=800, conv_chunksize=500)
    # The last four keys are read by vLLM's vision tower, not declared by transformers.
    vision = dict(depth=2, hidden_size=128, out_hidden_size=64, intermediate_size=128, num_heads=2,
                  in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  num_position_embeddings=2304, deepstack_visual_indexes=[0, 1],
                  image_size=768, apply_vit_abs_pos_embed=True, spatial_patch_size=16,
                  tokens_per_second=2)
    thinker = dict(audio_config=audio, vision_config=vision,
                   text_config=_moe_text(THINKER_VOCAB, num_layers=4),
                   audio_token_id=AUDIO_PAD, image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
                   audio_start_token_id=AUDIO_START, audio_end_token_id=AUDIO_END,
                   vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                   user_token_id=USER_WORD, position_id_per_seconds=13, seconds_per_chunk=2)
    talker_text = _moe_text(3072, num_layers=2)
    # Not a declared field, but the talker's MoE block reads it.
    talker_text["shared_expert_intermediate_size"] = 64
    code_predictor = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM,
                          num_code_groups=16, max_position_embeddings=4096, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    # accept_hidden_layer lies past the thinker layers that take deepstack visual features (one
    # per entry of deepstack_visual_indexes), as in the real checkpoint (24 > 3): there vLLM's
    # thinker and transformers' agree on the layer's output (vllm_backend/capture.py).
    talker = dict(text_config=talker_text, code_predictor_config=code_predictor, num_code_groups=16,
                  thinker_hidden_size=64, accept_hidden_layer=3,
                  spatial_merge_size=2,  # not a declared field; read by the talker's __init__
                  speaker_id=dict(SPEAKERS), position_id_per_seconds=13, seconds_per_chunk=2,
                  audio_token_id=AUDIO_PAD, image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
                  vision_start_token_id=VISION_START, audio_start_token_id=AUDIO_START,
                  audio_end_token_id=AUDIO_END, codec_pad_id=2148, codec_bos_id=2149,
                  codec_eos_token_id=2150, codec_nothink_id=2155, codec_think_bos_id=2156,
                  codec_think_eos_id=2157)
    code2wav = dict(codebook_size=2048, num_quantizers=16, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                    decoder_dim=64, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
                    max_position_embeddings=8000, sliding_window=72, rms_norm_eps=1e-5,
                    layer_scale_initial_scale=0.01,
                    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})
    return dict(thinker_config=thinker, talker_config=talker, code2wav_config=code2wav,
                enable_audio_output=True, im_start_token_id=IM_START, im_end_token_id=IM_END,
                tts_pad_token_id=TTS_PAD, tts_bos_token_id=TTS_BOS, tts_eos_token_id=TTS_EOS,
                system_token_id=SYSTEM_WORD, user_token_id=USER_WORD,
                assistant_token_id=ASSISTANT_WORD)


def tiny_config() -> Qwen3OmniMoeConfig:
    return Qwen3OmniMoeConfig(**tiny_config_kwargs())
