"""The end-of-turn model of `semantic_vad` (docs/realtime-api.md §2.4.2).

Smart Turn v3.2 (Daily's `smart-turn`, BSD-2-Clause): a Whisper-tiny encoder with a classifier
head, trained on speech cut at a pause to tell a finished turn ("What time is it?") from one the
speaker is still in ("I would like to book a table…"). It hears intonation and wording, not just
silence. Input: the last 8 s of 16 kHz audio (shorter audio zero-padded in front) as 80-bin
Whisper log-mel features of the waveform normalized to zero mean and unit variance; output:
the probability that the turn is finished.

The int8 CPU ONNX file ships inside the `pipecat-ai` package on PyPI. It is used from a file the
deploy names, else from that package, and must match the pinned SHA-256 (audio/model_files.py).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vllm_omni.audio.model_files import ModelFileUnavailableError, SharedOnnxModel, checked, configured, packaged
from vllm_omni.audio.pcm import MODEL_RATE

logger = logging.getLogger(__name__)

SMART_TURN_DISTRIBUTION = "pipecat-ai"
SMART_TURN_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
SMART_TURN_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
WINDOW_SAMPLES = 8 * MODEL_RATE
FINISHED_PROBABILITY = 0.5  # the model's own decision threshold
JUDGE_TIMEOUT_S = 2.0  # a later verdict is not waited for: the turn then ends at its longest pause


def resolve_end_of_turn_model(configured_path: str | None = None) -> Path:
    what = "Smart Turn end-of-turn"
    if configured_path:
        return configured(configured_path, SMART_TURN_SHA256, what)
    shipped = packaged(SMART_TURN_DISTRIBUTION, SMART_TURN_FILE)
    if shipped is None:
        raise ModelFileUnavailableError(
            "semantic_vad needs the Smart Turn v3.2 ONNX file (session_defaults.end_of_turn_model_path, or "
            f"the {SMART_TURN_DISTRIBUTION} package)")
    return checked(shipped, SMART_TURN_SHA256, what)


class EndOfTurnModel(SharedOnnxModel):
    """Judgements run one at a time on a thread of their own, off the event loop, so their CPU
    use is bounded however many sessions pause at once (a verdict that comes late only lets a
    turn run to its longest pause)."""

    _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="end-of-turn")

    def __init__(self, path: Path):
        from transformers import WhisperFeatureExtractor

        super().__init__(path)
        self._features = WhisperFeatureExtractor(feature_size=80, sampling_rate=MODEL_RATE, chunk_length=8)

    @classmethod
    def resolve(cls, configured_path: str | None) -> Path:
        return resolve_end_of_turn_model(configured_path)

    def finished_probability(self, audio: np.ndarray) -> float:
        """P(the speaker finished their turn) for 16 kHz float32 speech ending at a pause."""
        window = audio[-WINDOW_SAMPLES:].astype(np.float32, copy=False)
        window = np.pad(window, (WINDOW_SAMPLES - window.size, 0))
        features = self._features(window, sampling_rate=MODEL_RATE, padding="max_length", max_length=WINDOW_SAMPLES,
                                  truncation=True, do_normalize=True, return_tensors="np").input_features
        logits = self._session.run(None, {"input_features": features.astype(np.float32)})[0]
        return float(logits[0, 0])  # the output named "logits" is already a probability (a sigmoid)

    async def sounds_finished(self, audio: np.ndarray) -> bool:
        """Whether the turn sounds finished; a judgement that fails or takes longer than
        JUDGE_TIMEOUT_S counts as "not finished" (the longest pause still ends the turn)."""
        loop = asyncio.get_running_loop()
        try:
            probability = await asyncio.wait_for(
                loop.run_in_executor(self._executor, self.finished_probability, audio), JUDGE_TIMEOUT_S)
        except TimeoutError:
            logger.warning("end-of-turn judgement took longer than %.1f s; waiting for the longest pause",
                           JUDGE_TIMEOUT_S)
            return False
        except Exception:
            logger.exception("end-of-turn judgement failed; waiting for the longest pause")
            return False
        return probability >= FINISHED_PROBABILITY
