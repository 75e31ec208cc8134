"""A tiny Qwen2.5-Omni configuration that instantiates every module on CPU.

Widths and depths are tiny; vocabulary sizes, special-token ids and the token2wav frame
layout (DiT codes repeated twice into 80-bin mels, BigVGAN upsampling 5·3·2·2·2·2 = 240
samples per mel frame at 24 kHz) are the real Qwen2.5-Omni-7B checkpoint's, so every
id-dependent code path behaves as in production. Every LLM attention uses head_dim 64
(vLLM's CPU attention needs at least 32).
"""

from __future__ import annotations

from typing import Any

from transformers import Qwen2_5OmniConfig

from vllm_omni.models.byte_level_tokenizer import QWEN_ROLE_WORD_IDS

# Real Qwen2.5-Omni-7B special-token ids (thinker vocabulary).
ENDOFTEXT, IM_START, IM_END = 151643, 151644, 151645
AUDIO_PAD, AUDIO_START, AUDIO_END = 151646, 151647, 151648
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 151652, 151653, 151655, 151656
TTS_TEXT_PAD, TTS_TEXT_START, TTS_TEXT_END = 151859, 151860, 151861
USER_WORD = QWEN_ROLE_WORD_IDS["user"]
THINKER_VOCAB = 152064
# Talker (codec) vocabulary and its special ids.
TALKER_VOCAB = 8448
CODEC_PAD, CODEC_START, CODEC_END, CODEC_MASK = 8292, 8293, 8294, 8296
# Speaker → the thinker-vocabulary id the talker's text stream starts with (spk_dict.pt's
# "bos_token" in the real checkpoint: Chelsie 151872, Ethan 151870).
SPEAKER_BOS = {"Chelsie": 151872, "Ethan": 151870}

HEAD_DIM = 64
THINKER_HIDDEN = 128


def _mrope() -> dict[str, Any]:
    # Qwen2.5's (non-interleaved) M-RoPE; the sections sum to head_dim / 2.
    return {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [8, 12, 12]}


def tiny_config_kwargs() -> dict[str, Any]:
    """Keyword arguments for `Qwen2_5OmniConfig` describing the tiny checkpoint."""
    audio = dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
                 output_dim=THINKER_HIDDEN, num_mel_bins=128, max_source_positions=1500, n_window=100)
    # tokens_per_second is not a declared field; vLLM's thinker reads it (default 25, as here).
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, in_channels=3,
                  out_hidden_size=THINKER_HIDDEN, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1], tokens_per_second=25)
    text = dict(vocab_size=THINKER_VOCAB, hidden_size=THINKER_HIDDEN, intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=THINKER_HIDDEN // HEAD_DIM, num_key_value_heads=1,
                max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=_mrope(), bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT)
    # vision_start/end_token_id are not declared thinker fields, but get_rope_index reads the
    # start id for image and video prompts (the real config.json carries both).
    thinker = dict(audio_config=audio, vision_config=vision, text_config=text,
                   audio_token_index=AUDIO_PAD, image_token_index=IMAGE_PAD, video_token_index=VIDEO_PAD,
                   audio_start_token_id=AUDIO_START, audio_end_token_id=AUDIO_END,
                   vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                   user_token_id=USER_WORD, position_id_per_seconds=25, seconds_per_chunk=2,
                   tie_word_embeddings=False)
    talker = dict(vocab_size=TALKER_VOCAB, embedding_size=THINKER_HIDDEN, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1, head_dim=HEAD_DIM,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  rope_parameters=_mrope(),
                  audio_token_index=AUDIO_PAD, image_token_index=IMAGE_PAD, video_token_index=VIDEO_PAD,
                  vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
                  audio_start_token_id=AUDIO_START, audio_end_token_id=AUDIO_END,
                  tts_text_start_token_id=TTS_TEXT_START, tts_text_end_token_id=TTS_TEXT_END,
                  tts_text_pad_token_id=TTS_TEXT_PAD, tts_codec_start_token_id=CODEC_START,
                  tts_codec_end_token_id=CODEC_END, tts_codec_pad_token_id=CODEC_PAD,
                  tts_codec_mask_token_id=CODEC_MASK, position_id_per_seconds=25, seconds_per_chunk=2,
                  spatial_merge_size=2)
    dit = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, head_dim=HEAD_DIM, ff_mult=2,
               emb_dim=64, block_size=24, look_ahead_layers=[1], look_backward_layers=[0, 3], repeats=2,
               num_embeds=8193, mel_dim=80, enc_emb_dim=32, enc_dim=32, enc_channels=[32, 32, 32, 32, 96],
               enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=16,
               enc_res2net_scale=2, enc_se_channels=16)
    bigvgan = dict(mel_dim=80, upsample_initial_channel=64, resblock_kernel_sizes=[3, 7, 11],
                   resblock_dilation_sizes=[[1, 3, 5]] * 3, upsample_rates=[5, 3, 2, 2, 2, 2],
                   upsample_kernel_sizes=[11, 7, 4, 4, 4, 4])
    return dict(thinker_config=thinker, talker_config=talker,
                token2wav_config=dict(dit_config=dit, bigvgan_config=bigvgan), enable_audio_output=True)


def tiny_config() -> Qwen2_5OmniConfig:
    return Qwen2_5OmniConfig(**tiny_config_kwargs())
