"""transformers' Qwen3-Omni as the reference the parity tests compare with: its chat messages
for our test conversations, and its `generate` with the codec codes it hands its vocoder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoProcessor, Qwen3OmniMoeForConditionalGeneration

from tests.conftest import read_fixture_pcm
from tests.engine_helpers import TORCH_DEVICE

SPEAKER = "Ethan"


def hf_messages(turns: list[tuple[str, str | None, int, str | None]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Chat-template messages for (role, text, images, audio fixture) turns, a turn's `images`
    image parts first, then its audio, then its text; and the audio clips in order."""
    messages, audios = [], []
    for role, text, images, audio in turns:
        if role == "system":
            messages.append({"role": role, "content": text})
            continue
        parts: list[dict[str, Any]] = [{"type": "image"} for _ in range(images)]
        if audio:
            parts.append({"type": "audio"})
            audios.append(read_fixture_pcm(audio))
        if text:
            parts.append({"type": "text", "text": text})
        messages.append({"role": role, "content": parts})
    return messages, audios


def hf_generate(model: Any, inputs: dict[str, Any], *, speaks: bool, thinker_tokens: int,
                talker_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Greedy `generate` on the model's device: (sequences, waveform, the codes its vocoder got),
    on the CPU; the last two are None when it does not speak."""
    decoded = {}
    real_decode = model.code2wav.chunked_decode

    def keep_codes(codes, **kwargs):
        decoded["codes"] = codes[0].clone()
        return real_decode(codes, **kwargs)

    model.code2wav.chunked_decode = keep_codes
    try:
        output = model.generate(**inputs.to(model.device), return_audio=speaks, speaker=SPEAKER,
                                thinker_do_sample=False, thinker_max_new_tokens=thinker_tokens,
                                talker_do_sample=False, talker_max_new_tokens=talker_tokens)
    finally:
        model.code2wav.chunked_decode = real_decode
    if not speaks:
        return output.cpu(), None, None
    return output[0].cpu(), output[1].cpu(), decoded["codes"].cpu()


def cached_reference(checkpoint: Any, compute: Callable[[Any, Any, str], dict]) -> Callable[[str], dict]:
    """transformers' model (float32, on the tests' torch device) and processor on their own copy
    of `checkpoint`, and a function giving `compute(model, processor, case)`, computed once per case."""
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    model.to(TORCH_DEVICE)
    processor = AutoProcessor.from_pretrained(checkpoint)
    results: dict[str, dict] = {}

    def run(case: str) -> dict:
        if case not in results:
            results[case] = compute(model, processor, case)
        return results[case]

    return run
