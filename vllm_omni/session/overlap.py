"""What a duplex session does with input that arrives while an answer is generating
(docs/realtime-api.md §13.6): barge in, listen (keep it for the next turn), or drop it. The
session's `overlap_silence_rms` is the loudness below which an append without hints is silence.

`decide` applies the rules in order, first match wins: the append's own request
(`overlap_action`, `force_barge_in`, `force_listen`), a back-channel transcript, then, when
server VAD is off, the session's policy on whether the append sounds like speech. With server
VAD on and no request, None: the VAD decides (a speech onset barges in under
`barge_in_on_speech`; otherwise the speech becomes a deferred turn).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_omni.protocol import client_events as ce

BARGE_IN_ACTIONS = frozenset({"barge_in", "interrupt", "cancel"})
LISTEN_ACTIONS = frozenset({"listen", "continue", "continue_output", "ack"})
DROP_ACTIONS = frozenset({"drop", "ignore", "silence"})
BACK_CHANNELS = frozenset({
    "嗯", "嗯嗯", "对", "对的", "好", "好的", "继续", "继续说", "可以", "是的", "yes", "yeah", "yep", "ok", "okay",
    "continue", "go on", "keep going", "please continue", "right"})


@dataclass(frozen=True)
class OverlapDecision:
    action: str  # barge_in | listen | drop
    reason: str
    keep: bool  # whether the append's audio stays for the next turn


def sounds_like_speech(ev: ce.InputAudioBufferAppend, samples: np.ndarray, silence_rms: float) -> bool:
    """The client's hints if it gave any (`is_speech` / `speech`, a speech probability, `vad`),
    else the append's loudness against its own floor or `silence_rms` (the session's)."""
    vad = ev.vad or ce.VadHint()
    verdict = next((v for v in (ev.is_speech, ev.speech, vad.is_speech) if v is not None), None)
    if verdict is not None:
        return verdict
    probability = next((p for p in (ev.speech_probability, vad.speech_probability, vad.probability)
                        if p is not None), None)
    if probability is not None:
        return probability >= 0.5
    floor = next(f for f in (ev.overlap_silence_rms, vad.silence_rms, silence_rms) if f is not None)
    return samples.size > 0 and float(np.sqrt(np.mean(np.square(samples)))) >= floor


def is_back_channel(transcript: str | None) -> bool:
    return transcript is not None and transcript.strip().strip(".!?,。！？，").lower() in BACK_CHANNELS


def decide(ev: ce.InputAudioBufferAppend, samples: np.ndarray, *, policy: str, vad_on: bool,
           silence_rms: float) -> OverlapDecision | None:
    action = (ev.overlap_action or ev.overlap or "").lower()
    speech = sounds_like_speech(ev, samples, silence_rms)
    if action in BARGE_IN_ACTIONS:
        return OverlapDecision("barge_in", "client_overlap_action", keep=True)
    if action in LISTEN_ACTIONS:
        return OverlapDecision("listen", "client_overlap_action", keep=action == "listen" and speech)
    if action in DROP_ACTIONS:
        return OverlapDecision("drop", "client_overlap_action", keep=False)
    if ev.force_barge_in:
        return OverlapDecision("barge_in", "client_force_barge_in", keep=True)
    if ev.force_listen:
        return OverlapDecision("listen", "client_force_listen", keep=speech)
    if is_back_channel(ev.transcript):
        return OverlapDecision("listen", "short_ack_transcript", keep=False)
    if vad_on:
        return None
    if not speech:
        return OverlapDecision("drop", "silence_or_noise", keep=False)
    if policy == "listen_only":
        return OverlapDecision("listen", "policy_listen_only", keep=True)
    return OverlapDecision("barge_in", "policy_barge_in_on_speech", keep=True)


def decide_native(ev: ce.InputAudioBufferAppend, samples: np.ndarray, *, policy: str,
                  silence_rms: float) -> OverlapDecision:
    """For a natively duplex model, which hears overlapping audio itself (docs/realtime-api.md
    §13.7): the append barges in when it asks to, or when it sounds like speech under
    `barge_in_on_speech`; otherwise the model listens to it and decides."""
    action = (ev.overlap_action or ev.overlap or "").lower()
    if action in BARGE_IN_ACTIONS:
        return OverlapDecision("barge_in", "client_overlap_action", keep=True)
    if ev.force_barge_in:
        return OverlapDecision("barge_in", "client_force_barge_in", keep=True)
    if policy == "barge_in_on_speech" and sounds_like_speech(ev, samples, silence_rms):
        return OverlapDecision("barge_in", "barge_in_on_speech", keep=True)
    return OverlapDecision("listen", "auto_response_continuous", keep=True)
