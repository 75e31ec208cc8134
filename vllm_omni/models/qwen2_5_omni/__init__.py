"""Qwen2.5-Omni (thinker, talker, DiT + BigVGAN token2wav) support."""
