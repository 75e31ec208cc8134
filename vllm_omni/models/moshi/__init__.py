"""Moshi-family models (Kyutai's Moshi, PersonaPlex): natively full duplex in 80 ms frames
(docs/moshi.md)."""
