"""MiniCPM-o's duplex loop, whichever backend runs the LLM (docs/minicpmo.md, "The duplex loop").

A session's context grows unit by unit, never re-prefilled:

    <|im_start|>system\\n{prompt}\\n[<|audio_start|> voice rows <|audio_end|>]<|im_end|>
    <unit> [<image> 64 frame rows </image>] [10 audio rows] decision … terminator </unit>  <unit> …

Each unit's 10 audio rows come from the streaming mel front end and audio encoder; a unit
takes the frames of the append that closes it, or of an earlier append that closed none
(one group per unit, later groups waiting for later units; models/minicpmo/vision.py); the
logits at the last of them decide the unit (models/minicpmo/unit_decoder.py); each chosen
token is fed, and its last-layer hidden state (the one the LM head reads) is kept for the
talker, which turns a speaking unit's text into 25 codec codes (models/minicpmo/talker.py).

The loop never runs the LLM itself: its steps are generators that yield each `Feed` (runs of
token ids or embedding rows to append to the context) and receive the `Step` after it, the
logits and hidden state at the last fed position. A backend drives them: in torch
(torch_thinker.py) or on a vLLM engine (vllm_thinker.py), so both decide units with the very
same code.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from transformers import AutoTokenizer

from vllm_omni.models.minicpmo.audio_encoder import ENCODER_FRAMES_PER_UNIT, AudioEncoderState, StreamingAudioEncoder
from vllm_omni.models.minicpmo.config import MiniCPMOConfig, register_hf_classes
from vllm_omni.models.minicpmo.context_window import PREVIOUS_MARKER, KeptUnit, Rows, Run, WindowState, runs_length
from vllm_omni.models.minicpmo.mel_stream import StreamingMel
from vllm_omni.models.minicpmo.opening_settings import DEFAULT_WINDOW, ContextWindow
from vllm_omni.models.minicpmo.talker import Talker, TalkerSampling, TalkerTurn
from vllm_omni.models.minicpmo.tokenizer import register_tokenizer
from vllm_omni.models.minicpmo.unit_decoder import DuplexTokenIds, ScriptedDecision, UnitDecoder, UnitSampling
from vllm_omni.models.minicpmo.vision import FrameEncoder, preprocess

DEFAULT_SYSTEM_PROMPT = "Streaming Omni Conversation."
T = TypeVar("T")


MAX_FRAMES_PER_UNIT = 2  # a unit's frame group: a base frame and a composite (docs/realtime-api.md §13.8)


@dataclass(frozen=True)
class Feed:
    runs: list[Run]
    wants_step: bool = True  # False: nothing reads the step after it (a backend may defer the feed)
    restart: bool = False  # the runs replace the whole context (a context window slid)

    @property
    def length(self) -> int:
        return runs_length(self.runs)


@dataclass(frozen=True)
class Step:
    logits: torch.Tensor  # [vocab], raw, after the last fed position
    hidden: torch.Tensor  # [hidden], the last-layer state the LM head read there


Steps = Generator[Feed, Step | None, T]  # `Step | None`: None answers a feed that wants no step


@dataclass
class UnitResult:
    tokens: list[int]  # the unit's chosen tokens, its terminator last
    text: str  # the unit's response text
    codes: list[int]  # the talker's codes (empty for a listen unit)
    listened: bool
    ended_turn: bool  # `<|turn_eos|>` came in this unit
    token_times_s: list[float] = field(default_factory=list)  # monotonic, when each token was chosen

    @property
    def spoke(self) -> bool:
        return not self.listened


@dataclass
class SessionState:
    """One conversation's state outside the LLM: the decoder's, the audio front end's and the
    talker's, and what the context holds (a backend's session adds the LLM's state)."""

    decoder: UnitDecoder
    positions: int = 0  # context length so far
    mel: StreamingMel = field(default_factory=StreamingMel)
    audio: AudioEncoderState = field(default_factory=AudioEncoderState)
    talker_turn: TalkerTurn = field(default_factory=TalkerTurn)
    frame_groups: deque[list[bytes]] = field(default_factory=deque)  # waiting for the units they bind to
    units: int = 0
    fed: list[list[int] | str] = field(default_factory=list)  # the context per fed run: token ids, or a label
    window: WindowState | None = None  # set by the system turn's feed
    unit_runs: list[Run] = field(default_factory=list)  # what the open unit has fed so far


class DuplexLoop:
    """The checkpoint's tokenizer, audio and frame encoders and talker, and the loop's steps."""

    def __init__(self, path: str | Path, sampling: UnitSampling | None = None,
                 talker_sampling: TalkerSampling | None = None):
        register_hf_classes()  # a MiniCPM-o folder loads with our classes, never its remote code
        register_tokenizer()
        self.config = MiniCPMOConfig.from_pretrained(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.encoder = StreamingAudioEncoder.from_checkpoint(path)
        self.talker = Talker.from_checkpoint(path, talker_sampling or TalkerSampling())
        self.frames = FrameEncoder.from_checkpoint(path)
        self.ids = DuplexTokenIds.from_tokenizer(self.tokenizer)
        self.sampling = sampling or UnitSampling()
        self.max_context: int | None = None  # the most positions the backend holds (a backend sets it)

    def new_decoder(self, generator: torch.Generator | None) -> UnitDecoder:
        return UnitDecoder(self.ids, self.tokenizer.bad_token_ids, self._text, self.sampling, generator)

    def start_steps(self, session: SessionState, system_prompt: str, voice_rows: torch.Tensor | None,
                    user_text: str | None = None, window: ContextWindow = DEFAULT_WINDOW) -> Steps[None]:
        """Feed the system turn (with the voice prompt's rows, if any). `user_text` opens the
        conversation with a user turn the model answers (its turn is open from the first unit);
        `window` bounds the context from then on."""
        prefix: list[Run] = [self._encode(f"<|im_start|>system\n{system_prompt}\n")]
        if voice_rows is not None:
            prefix += [self._encode("<|audio_start|>"), Rows(voice_rows, "audio", f"[voice×{voice_rows.shape[0]}]"),
                       self._encode("<|audio_end|>")]
        suffix = "<|im_end|>"
        if user_text:
            suffix += f"\n<|im_start|>user\n{user_text}<|im_end|>\n<|im_start|>assistant\n"
            session.decoder.turn_ended = False
        session.window = WindowState(window, prefix, [self._encode(suffix)], self._encode(PREVIOUS_MARKER),
                                     limit=self.max_context, unit_headroom=self.unit_headroom())
        yield from self._feed(session, Feed([*prefix, self._encode(suffix)], wants_step=False))

    def unit_headroom(self) -> int:
        """The most positions one unit adds: `<unit>`, its frames, audio rows, decision, `</unit>`."""
        frame = self.config.query_num + 2  # `<image>` rows `</image>`
        return 2 + MAX_FRAMES_PER_UNIT * frame + ENCODER_FRAMES_PER_UNIT // self.config.audio_pool_step \
            + self.sampling.max_positions

    def append_steps(self, session: SessionState, samples: np.ndarray, frames: list[bytes] | None,
                     forced_listen: bool, script: ScriptedDecision | None) -> Steps[list[UnitResult]]:
        """Decide every unit these samples close (16 kHz float32); `frames` (encoded JPEG or PNG
        images) bind to the first unit that closes from now on without frames of its own."""
        if frames:
            session.frame_groups.append(frames)
        results = []
        for chunk in session.mel.append(samples):
            rows = self.encoder.encode_unit(torch.from_numpy(chunk), session.audio, first=session.units == 0)
            frame_group = session.frame_groups.popleft() if session.frame_groups else []
            results.append((yield from self._unit(session, frame_group, rows, forced_listen, script)))
            yield from self._slide(session)
        return results

    def schema(self, session: SessionState) -> list[str]:
        """The session's context, one entry per fed run: text as the tokenizer spells it,
        embedding runs as `[audio×10]`, `[image×64]`, … (for tests and debugging)."""
        return [run if isinstance(run, str) else self.tokenizer.decode(run) for run in session.fed]

    @torch.no_grad()
    def _unit(self, session: SessionState, frame_group: list[bytes], audio_rows: torch.Tensor, forced_listen: bool,
              script: ScriptedDecision | None) -> Steps[UnitResult]:
        session.unit_runs = []
        runs: list[Run] = [[self.ids.unit]]
        for frame in frame_group:
            runs += [self._encode("<image>"), Rows(self.frames(preprocess(frame)), "image",
                                                   f"[image×{self.config.query_num}]"), self._encode("</image>")]
        runs.append(Rows(audio_rows, "audio", f"[audio×{audio_rows.shape[0]}]"))
        step = yield from self._feed(session, Feed(runs))
        decoder = session.decoder
        decoder.begin_unit(forced_listen, script)
        tokens, times, hidden, text_tokens, ended_turn = [], [], [], [], False
        while True:
            choice = decoder.choose(step.logits)
            tokens.append(choice.token)
            times.append(time.monotonic())
            if choice.ends_unit:
                yield from self._feed(session, Feed([[choice.token, self.ids.unit_end]], wants_step=False))
                break
            step = yield from self._feed(session, Feed([[choice.token]]))
            hidden.append(step.hidden)
            ended_turn = ended_turn or choice.token == self.ids.turn_eos
            if choice.is_text:
                text_tokens.append(choice.token)
        session.units += 1
        listened = tokens[-1] == self.ids.listen and not text_tokens
        codes = [] if listened else self.talker.speak_unit(session.talker_turn, tokens[:-1], torch.stack(hidden),
                                                           ends_turn=ended_turn)
        if ended_turn:
            session.talker_turn = TalkerTurn()
        said = [token for token in text_tokens if token != self.ids.turn_eos]
        session.window.keep(KeptUnit(session.unit_runs, said))
        return UnitResult(tokens, self._text(text_tokens), codes, listened, ended_turn, times)

    def _slide(self, session: SessionState) -> Steps[None]:
        """Past the session's window: the oldest units go, the rest is the new context."""
        runs = session.window.slide()
        if runs is not None:
            yield from self._feed(session, Feed(runs, wants_step=False, restart=True))

    def _feed(self, session: SessionState, feed: Feed) -> Steps[Step]:
        """Have the backend feed `feed`, then record it in the session's context."""
        step = yield feed
        labels = [run if isinstance(run, list) else run.label for run in feed.runs]
        if feed.restart:
            session.positions, session.fed = feed.length, labels
        else:
            session.positions += feed.length
            session.fed += labels
            session.unit_runs += feed.runs
        return step

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)
