"""MiniCPM-o's duplex loop in torch: the reference the vLLM stage is checked against, and a CPU
backend (docs/minicpmo.md, "The duplex loop").

A session's context grows unit by unit in one KV cache, never re-prefilled:

    <|im_start|>system\\n{prompt}\\n[<|audio_start|> voice rows <|audio_end|>]<|im_end|>
    <unit> [<image> 64 frame rows </image>] [10 audio rows] decision … terminator </unit>  <unit> …

Each unit's 10 audio rows come from the streaming mel front end and audio encoder; a unit
takes the frames of the append that closes it, or of an earlier append that closed none
(one group per unit, later groups waiting for later units; models/minicpmo/vision.py); the
logits at the last of them decide the unit (models/minicpmo/unit_decoder.py); each chosen
token is fed, and its last-layer hidden state (the one the LM head reads) is kept for the
talker, which turns a speaking unit's text into 25 codec codes (models/minicpmo/talker.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, DynamicCache, Qwen3ForCausalLM

from vllm_omni.models.minicpmo.audio_encoder import AudioEncoderState, StreamingAudioEncoder
from vllm_omni.models.minicpmo.config import MiniCPMOConfig
from vllm_omni.models.minicpmo.mel_stream import StreamingMel
from vllm_omni.models.minicpmo.talker import Talker, TalkerSampling, TalkerTurn
from vllm_omni.models.minicpmo.unit_decoder import DuplexTokenIds, ScriptedDecision, UnitDecoder, UnitSampling
from vllm_omni.models.minicpmo.vision import FrameEncoder, preprocess

DEFAULT_SYSTEM_PROMPT = "Streaming Omni Conversation."


@dataclass
class UnitResult:
    tokens: list[int]  # the unit's chosen tokens, its terminator last
    text: str  # the unit's response text
    codes: list[int]  # the talker's codes (empty for a listen unit)
    listened: bool
    ended_turn: bool  # `<|turn_eos|>` came in this unit

    @property
    def spoke(self) -> bool:
        return not self.listened


@dataclass
class DuplexSession:
    """One conversation's state: the LLM's cache, the audio front end's and the talker's."""

    decoder: UnitDecoder
    cache: DynamicCache = field(default_factory=DynamicCache)
    positions: int = 0  # context length so far
    mel: StreamingMel = field(default_factory=StreamingMel)
    audio: AudioEncoderState = field(default_factory=AudioEncoderState)
    talker_turn: TalkerTurn = field(default_factory=TalkerTurn)
    frame_groups: deque[list[bytes]] = field(default_factory=deque)  # waiting for the units they bind to
    units: int = 0
    fed: list[list[int] | str] = field(default_factory=list)  # the context per fed run: token ids, or a label


class TorchDuplexThinker:
    def __init__(self, path: str | Path, sampling: UnitSampling | None = None,
                 talker_sampling: TalkerSampling | None = None):
        self.config = MiniCPMOConfig.from_pretrained(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.llm = Qwen3ForCausalLM(self.config).eval()
        self.llm.load_state_dict({name[len("llm."):]: tensor for name, tensor in
                                  load_file(Path(path) / "model.safetensors").items() if name.startswith("llm.")},
                                 strict=True)
        self.encoder = StreamingAudioEncoder.from_checkpoint(path)
        self.talker = Talker.from_checkpoint(path, talker_sampling or TalkerSampling())
        self.frames = FrameEncoder.from_checkpoint(path)
        self.ids = DuplexTokenIds.from_tokenizer(self.tokenizer)
        self.sampling = sampling or UnitSampling()

    def start(self, system_prompt: str = DEFAULT_SYSTEM_PROMPT, voice_rows: torch.Tensor | None = None,
              generator: torch.Generator | None = None) -> DuplexSession:
        """A session whose context holds the system turn (with the voice prompt's rows, if any)."""
        decoder = UnitDecoder(self.ids, self.tokenizer.bad_token_ids, self._text, self.sampling, generator)
        session = DuplexSession(decoder)
        prefix = f"<|im_start|>system\n{system_prompt}\n"
        if voice_rows is None:
            self._feed_text(session, prefix + "<|im_end|>")
        else:
            self._feed_text(session, prefix + "<|audio_start|>")
            self._feed(session, voice_rows, f"[voice×{voice_rows.shape[0]}]")
            self._feed_text(session, "<|audio_end|><|im_end|>")
        return session

    def append_audio(self, session: DuplexSession, samples: np.ndarray, *, frames: list[bytes] | None = None,
                     forced_listen: bool = False, script: ScriptedDecision | None = None) -> list[UnitResult]:
        """Decide every unit these samples close (16 kHz float32); `frames` (encoded JPEG or PNG
        images) bind to the first unit that closes from now on without frames of its own."""
        if frames:
            session.frame_groups.append(frames)
        results = []
        for chunk in session.mel.append(samples):
            rows = self.encoder.encode_unit(torch.from_numpy(chunk), session.audio, first=session.units == 0)
            frame_group = session.frame_groups.popleft() if session.frame_groups else []
            results.append(self._unit(session, frame_group, rows, forced_listen, script))
        return results

    @torch.no_grad()
    def _unit(self, session: DuplexSession, frame_group: list[bytes], audio_rows: torch.Tensor, forced_listen: bool,
              script: ScriptedDecision | None) -> UnitResult:
        self._feed_ids(session, [self.ids.unit])
        for frame in frame_group:
            self._feed_text(session, "<image>")
            self._feed(session, self.frames(preprocess(frame)), f"[image×{self.config.query_num}]")
            self._feed_text(session, "</image>")
        logits, _ = self._feed(session, audio_rows, f"[audio×{audio_rows.shape[0]}]")
        decoder = session.decoder
        decoder.begin_unit(forced_listen, script)
        tokens, hidden, text_tokens, ended_turn = [], [], [], False
        while True:
            choice = decoder.choose(logits)
            tokens.append(choice.token)
            if choice.ends_unit:
                self._feed_ids(session, [choice.token, self.ids.unit_end])
                break
            logits, state = self._feed_ids(session, [choice.token])
            hidden.append(state)
            ended_turn = ended_turn or choice.token == self.ids.turn_eos
            if choice.is_text:
                text_tokens.append(choice.token)
        session.units += 1
        listened = tokens[-1] == self.ids.listen and not text_tokens
        codes = [] if listened else self.talker.speak_unit(session.talker_turn, tokens[:-1], torch.stack(hidden),
                                                           ends_turn=ended_turn)
        if ended_turn:
            session.talker_turn = TalkerTurn()
        return UnitResult(tokens, self._text(text_tokens), codes, listened, ended_turn)

    def schema(self, session: DuplexSession) -> list[str]:
        """The session's context, one entry per fed run: text as the tokenizer spells it,
        embedding runs as `[audio×10]`, `[image×64]`, … (for tests and debugging)."""
        return [run if isinstance(run, str) else self.tokenizer.decode(run) for run in session.fed]

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _feed_text(self, session: DuplexSession, text: str) -> None:
        self._feed_ids(session, self.tokenizer.encode(text, add_special_tokens=False))

    def _feed_ids(self, session: DuplexSession, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.llm.model.embed_tokens(torch.tensor(ids))
        return self._feed(session, rows, ids)

    def _feed(self, session: DuplexSession, rows: torch.Tensor, run: list[int] | str) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
        """Feed `rows` at the next positions: (logits after the last, its hidden state)."""
        positions = torch.arange(session.positions, session.positions + rows.shape[0])[None]
        output = self.llm.model(inputs_embeds=rows[None], position_ids=positions, past_key_values=session.cache,
                                use_cache=True)
        session.positions += rows.shape[0]
        session.fed.append(run)
        last = output.last_hidden_state[0, -1]
        return self.llm.lm_head(last), last
