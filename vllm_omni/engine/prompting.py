"""A request's conversation as chat-template messages, fitted to what the first stage takes.

Messages become the Hugging Face chat-template shape (content parts of type 'image',
'audio' and 'text', in that order within a user turn) plus each turn's media inputs: the
family's decoded images and the audio features; the family renders them. When the
conversation holds more items of a modality than the text stage's `limit_mm_per_prompt`,
the oldest items of that modality go first; when it outgrows the context, the oldest turns
are left out (system instructions and the current turn always stay). Both go a quarter of the
limit at a time, so that consecutive turns keep a common prefix for vLLM's prefix cache. Also each stage's
sampling parameters for a request (`request_sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from vllm_omni.audio.pcm import validate_model_audio
from vllm_omni.config import SamplingParams
from vllm_omni.config.errors import describe_validation_error
from vllm_omni.engine.family import GENERATED_IDS, ModelFamily, Prompt
from vllm_omni.engine.request import Message, OmniRequest, RequestError

MEDIA = ("image", "audio")  # content part types carrying a media input; also `limit_mm_per_prompt` keys


@dataclass
class Turn:
    message: dict[str, Any]  # chat-template message
    # per part type in MEDIA: the inputs of the message's parts of that type, in order
    media: dict[str, list[Any]] = field(default_factory=lambda: {modality: [] for modality in MEDIA})


def render_conversation(family: ModelFamily, messages: list[Message], tools: list[dict[str, Any]] = (),
                        call_tool: bool = False) -> Prompt:
    """`tools` are offered in the prompt; `call_tool` makes the prompt open a tool call."""
    turns = [chat_turn(family, message, f"messages[{i}]") for i, message in enumerate(messages)]
    if not turns or turns[-1].message["role"] not in ("user", "tool"):
        raise RequestError("messages: the last turn must be the user's (or a tool result)")
    engine_args = family.deploy.stage_by_role(family.text_role).engine_args
    for modality in MEDIA:
        fit_media_limit(turns, modality, engine_args.mm_limit(modality), family.text_role)
    return fit_context(family, turns, tools, call_tool)


def _in_quarters(amount: int, whole: int) -> int:
    """`amount` rounded up to a multiple of a quarter of `whole` (at least 1)."""
    step = max(1, whole // 4)
    return -(-amount // step) * step


def _render(family: ModelFamily, turns: list[Turn], tools: list[dict[str, Any]], call_tool: bool) -> Prompt:
    return family.render([t.message for t in turns], [f for t in turns for f in t.media["audio"]], tools,
                         call_tool, images=[image for t in turns for image in t.media["image"]])


def fit_context(family: ModelFamily, turns: list[Turn], tools: list[dict[str, Any]] = (),
                call_tool: bool = False) -> Prompt:
    """The prompt of `turns`, the oldest (non-system) turns left out while it outgrows the
    context. They go a quarter of the context at a time (the tokens left out are rounded up
    to a multiple of it), so the turns that follow leave out the same ones and their prompts
    share a prefix with this one: vLLM's prefix cache keeps hitting until the next quarter
    goes, instead of missing on every turn once the context is full."""
    prompt = _render(family, turns, tools, call_tool)
    full = len(prompt)
    if full < family.max_model_len:
        return prompt
    target = _in_quarters(full - family.max_model_len + 1, family.max_model_len)  # tokens to leave out
    turns = list(turns)
    while full - len(prompt) < target:  # then the prompt fits, as target >= what must go
        oldest = next((i for i, t in enumerate(turns[:-1]) if t.message["role"] != "system"), None)
        if oldest is None:
            if len(prompt) < family.max_model_len:
                return prompt
            raise RequestError(f"prompt is {len(prompt)} tokens; the model's context is {family.max_model_len}")
        del turns[oldest]
        prompt = _render(family, turns, tools, call_tool)
    return prompt


def fit_media_limit(turns: list[Turn], modality: str, limit: int, stage: str) -> None:
    """Keep at most `limit` items of `modality` (vLLM refuses more; the torch backend keeps the
    same limit): the oldest items go first, a quarter of the limit at a time (as turns go in
    `fit_context`, so that later turns leave out the same items), and a turn left with no
    content goes. Items of the current turn are never dropped: if they alone are too many, the
    request is refused."""
    count = sum(len(t.media[modality]) for t in turns)
    if count <= limit:
        return
    if len(turns[-1].media[modality]) > limit:
        raise RequestError(f"the current turn carries {len(turns[-1].media[modality])} {modality} item(s), but "
                           f"the {stage} stage's limit_mm_per_prompt allows {limit} {modality} items per prompt")
    droppable = count - len(turns[-1].media[modality])
    for _ in range(min(droppable, _in_quarters(count - limit, limit))):
        oldest = next(i for i, t in enumerate(turns[:-1]) if t.media[modality])
        turn = turns[oldest]
        parts = list(turn.message["content"])
        del parts[next(i for i, part in enumerate(parts) if part["type"] == modality)]
        if parts:
            turns[oldest] = Turn({**turn.message, "content": parts}, {**turn.media, modality: turn.media[modality][1:]})
        else:
            del turns[oldest]


def chat_turn(family: ModelFamily, message: Message, where: str) -> Turn:
    if message.role not in ("system", "user", "assistant", "tool"):
        raise RequestError(f"{where}.role: expected system, user, assistant or tool, got {message.role!r}")
    if message.role == "tool":
        return Turn({"role": "tool", "content": message.text or "", "tool_call_id": message.tool_call_id})
    turn = Turn({"role": message.role})
    parts: list[dict[str, Any]] = []
    if message.images:
        turn.media["image"] = decoded_images(family, message, where)
        parts += [{"type": "image"} for _ in message.images]
    if message.audio is not None or message.audio_stream is not None:
        if message.role != "user":
            raise RequestError(f"{where}: only user turns may carry audio")
        stream = message.audio_stream
        try:
            if stream is None:
                stream = family.audio_stream()
                stream.append(validate_model_audio(message.audio, message.sample_rate, f"{where}.audio"))
            turn.media["audio"].append(stream.close())
        except ValueError as exc:
            source = "audio" if message.audio_stream is None else "audio_stream"
            text = str(exc) if str(exc).startswith(where) else f"{where}.{source}: {exc}"
            raise RequestError(text) from None
        parts.append({"type": "audio"})
    if message.text:
        parts.append({"type": "text", "text": message.text})
    if message.tool_calls and message.role != "assistant":
        raise RequestError(f"{where}: only assistant turns carry tool calls")
    if message.token_ids and message.role != "assistant":
        raise RequestError(f"{where}: only assistant turns carry generated token ids")
    if not parts and not message.tool_calls:
        raise RequestError(f"{where}: has neither text nor audio nor images")
    turn.message["content"] = parts[0]["text"] if message.role == "system" and len(parts) == 1 else parts
    if message.token_ids and message.text and not message.tool_calls:
        turn.message[GENERATED_IDS] = list(message.token_ids)
    if message.tool_calls:
        turn.message["tool_calls"] = [{"type": "function", "id": call.call_id,
                                       "function": {"name": call.name, "arguments": call.arguments}}
                                      for call in message.tool_calls]
    return turn


def decoded_images(family: ModelFamily, message: Message, where: str) -> list[Any]:
    """The family's inputs for a user turn's encoded images; bytes it cannot decode fail the
    request, naming the image."""
    if message.role != "user":
        raise RequestError(f"{where}: only user turns may carry images")
    if not isinstance(message.images, (list, tuple)):
        raise RequestError(f"{where}.images: expected a list of encoded images, got {type(message.images).__name__}")
    decoded = []
    for i, data in enumerate(message.images):
        if not isinstance(data, (bytes, bytearray)):
            raise RequestError(f"{where}.images[{i}]: expected JPEG or PNG bytes, got {type(data).__name__}")
        try:
            decoded.append(family.decode_image(bytes(data)))
        except ValueError as exc:
            raise RequestError(f"{where}.images[{i}]: {exc}") from None
    return decoded


def request_sampling(family: ModelFamily, request: OmniRequest) -> dict[str, SamplingParams]:
    """Each stage's sampling for `request`: the stage's defaults, then the request's generic
    settings (text stage: max tokens, temperature, top_p; every stage: the seed unless its
    defaults fix one), then the request's per-role overrides."""
    unknown = set(request.sampling) - set(family.roles)
    if unknown:
        raise RequestError(f"sampling: no stage with role {sorted(unknown)[0]!r} (roles: {', '.join(family.roles)})")
    return {role: _stage_sampling(family, request, role) for role in family.roles}


def _stage_sampling(family: ModelFamily, request: OmniRequest, role: str) -> SamplingParams:
    defaults = family.deploy.stage_by_role(role).default_sampling_params
    generic = {"seed": request.seed if defaults.seed is None else None}
    if role == family.text_role:
        generic |= {"max_tokens": request.max_output_tokens, "temperature": request.temperature, "top_p": request.top_p}
    overrides = {**{k: v for k, v in generic.items() if v is not None}, **request.sampling.get(role, {})}
    try:
        return SamplingParams.model_validate({**defaults.model_dump(), **overrides})
    except ValidationError as exc:
        raise RequestError("; ".join(describe_validation_error(exc, ("sampling", role)))) from None
