"""MiniCPM-o's duplex loop (duplex_loop.py) with the LLM in torch: the reference the vLLM stage is
checked against, and a CPU backend (docs/minicpmo.md, "The duplex loop").

A session's context is one transformers KV cache; each feed is one forward over its runs'
rows at the next positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import DynamicCache, Qwen3ForCausalLM

from vllm_omni.models.minicpmo.duplex_loop import (
    DEFAULT_SYSTEM_PROMPT,
    DuplexLoop,
    Feed,
    Rows,
    SessionState,
    Step,
    Steps,
    UnitResult,
)
from vllm_omni.models.minicpmo.opening_settings import DEFAULT_WINDOW, ContextWindow
from vllm_omni.models.minicpmo.talker import TalkerSampling
from vllm_omni.models.minicpmo.unit_decoder import ScriptedDecision, UnitSampling

T = TypeVar("T")


@dataclass
class DuplexSession(SessionState):
    """One conversation: the loop's state and the LLM's cache."""

    cache: DynamicCache = field(default_factory=DynamicCache)


class TorchDuplexThinker(DuplexLoop):
    def __init__(self, path: str | Path, sampling: UnitSampling | None = None,
                 talker_sampling: TalkerSampling | None = None):
        super().__init__(path, sampling, talker_sampling)
        self.llm = Qwen3ForCausalLM(self.config).eval()
        self.llm.load_state_dict({name[len("llm."):]: tensor for name, tensor in
                                  load_file(Path(path) / "model.safetensors").items() if name.startswith("llm.")},
                                 strict=True)
        self.max_context = self.config.max_position_embeddings

    def start(self, system_prompt: str = DEFAULT_SYSTEM_PROMPT, voice_rows: torch.Tensor | None = None,
              generator: torch.Generator | None = None, user_text: str | None = None,
              window: ContextWindow = DEFAULT_WINDOW) -> DuplexSession:
        """A session whose context holds the system turn (with the voice prompt's rows, if any)
        and, with `user_text`, the user's opening turn; `window` bounds it."""
        session = DuplexSession(self.new_decoder(generator))
        self._drive(session, self.start_steps(session, system_prompt, voice_rows, user_text, window))
        return session

    def append_audio(self, session: DuplexSession, samples: np.ndarray, *, frames: list[bytes] | None = None,
                     forced_listen: bool = False, script: ScriptedDecision | None = None) -> list[UnitResult]:
        """Decide every unit these samples close (see `DuplexLoop.append_steps`)."""
        return self._drive(session, self.append_steps(session, samples, frames, forced_listen, script))

    def close(self, session: DuplexSession) -> None:
        """Free the session's context now, not with its last reference."""
        session.cache = DynamicCache()

    def _drive(self, session: DuplexSession, steps: Steps[T]) -> T:
        try:
            feed = next(steps)
            while True:
                feed = steps.send(self._forward(session, feed))
        except StopIteration as done:
            return done.value

    @torch.no_grad()
    def _forward(self, session: DuplexSession, feed: Feed) -> Step:
        """Feed the runs' rows at the next positions (from 0 in a new cache when the feed restarts
        the context): the logits after the last, its hidden state."""
        if feed.restart:
            session.cache = DynamicCache()
        start = 0 if feed.restart else session.positions
        rows = torch.cat([run.rows if isinstance(run, Rows) else self.llm.model.embed_tokens(torch.tensor(run))
                          for run in feed.runs])
        positions = torch.arange(start, start + rows.shape[0])[None]
        output = self.llm.model(inputs_embeds=rows[None], position_ids=positions, past_key_values=session.cache,
                                use_cache=True)
        last = output.last_hidden_state[0, -1]
        return Step(self.llm.lm_head(last), last)
