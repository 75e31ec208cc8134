"""What a duplex session does with input that arrives while an answer is generating
(docs/realtime-api.md §13.6): barge in, listen (keep it for the next turn), or drop it.

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
SHORT_ACK_MS = 700  # overlapping speech up to this long is a back-channel, not a turn
SILENCE_RMS = 0.003  # below this an append without hints is not speech


@dataclass(frozen=True)
class OverlapDecision:
    action: str  # barge_in | listen | drop
    reason: str
    keep: bool  # whether the append's audio stays for the next turn


def sounds_like_speech(ev: ce.InputAudioBufferAppend, samples: np.ndarray) -> bool:
    """The client's hints if it gave any, else the append's loudness."""
    if ev.is_speech is not None:
        return ev.is_speech
    if ev.vad is not None:
        if ev.vad.is_speech is not None:
            return ev.vad.is_speech
        probability = ev.vad.speech_probability if ev.vad.speech_probability is not None else ev.vad.probability
        if probability is not None:
            return probability >= 0.5
    threshold = ev.overlap_silence_rms if ev.overlap_silence_rms is not None else SILENCE_RMS
    return samples.size > 0 and float(np.sqrt(np.mean(np.square(samples)))) >= threshold


def is_back_channel(transcript: str | None) -> bool:
    return transcript is not None and transcript.strip().strip(".!?,。！？，").lower() in BACK_CHANNELS


def decide(ev: ce.InputAudioBufferAppend, samples: np.ndarray, *, policy: str,
           vad_on: bool) -> OverlapDecision | None:
    action = (ev.overlap_action or ev.overlap or "").lower()
    speech = sounds_like_speech(ev, samples)
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


def decide_native(ev: ce.InputAudioBufferAppend, samples: np.ndarray, *, policy: str) -> OverlapDecision:
    """For a natively duplex model, which hears overlapping audio itself (docs/realtime-api.md
    §13.7): the append barges in when it asks to, or when it sounds like speech under
    `barge_in_on_speech`; otherwise the model listens to it and decides."""
    action = (ev.overlap_action or ev.overlap or "").lower()
    if action in BARGE_IN_ACTIONS:
        return OverlapDecision("barge_in", "client_overlap_action", keep=True)
    if ev.force_barge_in:
        return OverlapDecision("barge_in", "client_force_barge_in", keep=True)
    if policy == "barge_in_on_speech" and sounds_like_speech(ev, samples):
        return OverlapDecision("barge_in", "barge_in_on_speech", keep=True)
    return OverlapDecision("listen", "auto_response_continuous", keep=True)
