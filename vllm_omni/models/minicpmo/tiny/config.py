"""The tiny MiniCPM-o 4.5 configuration: the real architecture, tiny widths and depths.

Token ids and vocabulary sizes are the real checkpoint's (151 748 LLM ids; codec vocabulary
6562), so every id-dependent path behaves as in production. The constraints that shape it
(docs/minicpmo.md, "Tiny checkpoint"):

* the LLM's hidden size is a multiple of 128: the resampler has hidden // 128 heads;
* the LLM's head_dim is 64 (vLLM's CPU attention needs at least 32);
* Whisper's FFN is 4 × d_model: the audio projector's input width is FFN // 4;
* `max_source_positions` 1500 sets when the streaming audio encoder's cache starts over (30 s);
* the vision width (32) differs from the LLM's (128), so the resampler has its `kv_proj`.
"""

from __future__ import annotations

from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.tokenizer import FIRST_SPECIAL_ID, SPECIAL_TOKENS

LLM_VOCAB = FIRST_SPECIAL_ID + len(SPECIAL_TOKENS)  # 151 748: every special token has an embedding row
ENDOFTEXT, IM_END = 151643, 151645
CODEC_VOCAB = 6562
AUDIO_BOS, TEXT_EOS = 151687, 151692  # the talker's markers (the reference server's values)


def tiny_config() -> MiniCPMOConfig:
    return MiniCPMOConfig(
        architectures=["MiniCPMO"], dtype="float32",
        vocab_size=LLM_VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, intermediate_size=256, rms_norm_eps=1e-6, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, tie_word_embeddings=False,
        bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT,
        query_num=64, image_size=448, drop_vision_last_layer=True, audio_pool_step=5, audio_chunk_length=1.0,
        stream_input=True, slice_config={"patch_size": 14, "max_slice_nums": 9, "scale_resolution": 448},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "patch_size": 14, "image_size": 980},
        audio_config={"d_model": 64, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 256,
                      "decoder_layers": 2, "decoder_attention_heads": 2, "decoder_ffn_dim": 256,
                      "num_mel_bins": 80, "max_source_positions": 1500},
        tts_config={"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
                    "num_hidden_layers": 2, "max_position_embeddings": 4096, "llm_dim": 128,
                    "num_audio_tokens": CODEC_VOCAB, "num_text_tokens": LLM_VOCAB, "audio_bos_token_id": AUDIO_BOS,
                    "text_eos_token_id": TEXT_EOS})
