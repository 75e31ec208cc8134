"""The contract a model family implements so the engine can drive its pipeline.

The engine knows nothing of any model: it asks the family for its stage programs (one per
replica of each role the deploy config declares), how a conversation becomes the first stage's prompt, the
messages that start a request, and, for every event a stage emits, which messages go to
which stage. A family routes only along the edges it declares, and the deploy config must
declare a connector for each (`engine/graph.py`). Families register by checkpoint
architecture in `vllm_omni/models/registry.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from vllm_omni.config import DeployConfig, SamplingParams, StageConfig
from vllm_omni.engine.request import AudioInputStream, ToolCall
from vllm_omni.engine.stage_api import AsyncStageDriver, StageProgram

Route = list[tuple[str, object]]  # (role of the receiving stage, message)
GENERATED_IDS = "generated_ids"  # an assistant chat-template message's generated token ids (`render`)


class Prompt(Protocol):
    """A rendered first-stage prompt; its length counts against the model's context."""

    def __len__(self) -> int: ...

    @property
    def image_tokens(self) -> int:
        """Positions of the prompt that hold image embeddings (part of its length)."""

    @property
    def audio_tokens(self) -> int:
        """Positions of the prompt that hold audio embeddings (part of its length)."""


class ToolCallParser(Protocol):
    def feed(self, token_id: int) -> tuple[bool, ToolCall | None]:
        """(whether the token is answer text, a call it completed)."""

    def finish(self) -> ToolCall | None:
        """A call still open when the text stage ended (a forced call ends with the answer)."""


class ModelFamily(Protocol):
    name: str  # as the registry (models/registry.py) knows it
    roles: tuple[str, ...]  # stage roles the pipeline needs, upstream first
    edges: tuple[tuple[str, str], ...]  # (from role, to role) pairs the router sends along
    text_role: str  # the stage writing the text answer: its tokens, finish reason and limits
    audio_token_role: str | None  # the stage whose outputs count as audio tokens (usage)
    deploy: DeployConfig

    @property
    def output_sample_rate(self) -> int:
        """Rate of the audio the family's last stage produces."""

    @property
    def speakers(self) -> list[str]:
        """Voice names (lower case); empty for a model without voices."""

    @property
    def default_speaker(self) -> str | None: ...

    @property
    def tokenizer(self) -> Any:
        """Hugging Face tokenizer of the text stage (for detokenising its tokens)."""

    @property
    def max_model_len(self) -> int:
        """The longest prompt the text stage takes."""

    def audio_stream(self) -> AudioInputStream:
        """A stream computing the family's audio input features as samples arrive."""

    def decode_image(self, data: bytes) -> Any:
        """The family's input for one encoded image (JPEG or PNG bytes), handed back to
        `render`; raise ValueError naming the problem when the bytes are not such an image."""

    def make_program(self, stage: StageConfig) -> StageProgram | AsyncStageDriver:
        """The program of one replica of `stage` (its own devices): a step program (torch
        backend) or an engine driver (vllm backend)."""

    def remote_program(self, stage: StageConfig) -> Callable[[], StageProgram | AsyncStageDriver]:
        """`make_program(stage)` to be called in another process (a Ray actor's): a picklable
        function that loads what the stage needs there itself."""

    def render(self, messages: Sequence[dict[str, Any]], audio_features: Sequence[Any],
               tools: Sequence[dict[str, Any]] = (), call_tool: bool = False, images: Sequence[Any] = ()) -> Prompt:
        """The first stage's prompt from chat-template messages (content parts of type 'text',
        'audio' or 'image'; assistant `tool_calls`, "tool" results); `audio_features[i]` belongs
        to the i-th audio part, `images[i]` (from `decode_image`) to the i-th image part.
        `tools` ({"name", "description", "parameters"}) are offered the way the checkpoint's
        template does it; `call_tool` ends the prompt at the opening of a tool call. An
        assistant message's GENERATED_IDS are the ids the model generated for its text; a
        renderer that can should put them in place of the text tokenized again, while they still
        spell it (the prefix cache then reuses the KV of their generation)."""

    def check_speaker(self, speaker: str) -> None:
        """Raise ValueError naming the known voices if `speaker` is not one."""

    def start(self, request_id: str, prompt: Prompt, sampling: dict[str, SamplingParams], speaker: str | None,
              wants_audio: bool, forced_tools: Sequence[dict[str, Any]] | None = None) -> tuple[Any, Route]:
        """Per-request routing state and the messages that start the request. With
        `forced_tools`, the text stage must write a call of one of them (its arguments
        constrained to the tool's schema) and nothing is spoken; raise `RequestError` where
        the family's backends cannot constrain the output."""

    def tool_call_parser(self, forced: bool) -> ToolCallParser:
        """Reads the text stage's tokens of one request: which are answer text, which write calls."""

    def route(self, state: Any, role: str, event: object) -> Route:
        """Messages caused by `event` from the stage `role` (called under the engine's lock)."""

    def final_role(self, state: Any) -> str:
        """The stage whose `StageDone` ends the request."""
