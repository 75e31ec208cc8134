"""Render a conversation into thinker token ids with audio and image placeholders expanded."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

from vllm_omni.engine.family import GENERATED_IDS
from vllm_omni.models.qwen3_omni.images import ThinkerImage
from vllm_omni.models.qwen3_omni.tool_calls import CALL_OPEN


@dataclass
class ThinkerPrompt:
    input_ids: list[int]
    audio_features: list[torch.Tensor]  # one [128, frames] tensor per audio placeholder, in order
    images: list[ThinkerImage] = field(default_factory=list)  # one per image placeholder, in order
    audio_tokens: int = 0  # positions holding audio embeddings (of the prompt's length)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def image_tokens(self) -> int:
        return sum(image.num_tokens for image in self.images)

    @property
    def audio_lengths(self) -> list[int]:
        """Mel frames of each audio item."""
        return [f.shape[-1] for f in self.audio_features]

    @property
    def image_grid_thw(self) -> torch.Tensor | None:
        """[images, 3] patch grids, as transformers' thinker takes them; None without images."""
        return torch.stack([image.grid_thw for image in self.images]) if self.images else None


_SLOT = "\ue000{}\ue001"  # private-use marks around an answer's index: no tokenizer output spells them
_SLOT_PATTERN = re.compile("\ue000(\\d+)\ue001")


def audio_token_count(num_frames: int, n_window: int) -> int:
    """Audio-encoder outputs (one `<|audio_pad|>` each) for `num_frames` mel frames."""
    return int(_get_feat_extract_output_lengths(torch.tensor(num_frames), n_window))


def template_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                 tools: Sequence[dict[str, Any]], call_tool: bool, end_id: int) -> list[int]:
    """The chat template's token ids for `messages`, with each assistant answer's generated ids
    (GENERATED_IDS, those before the `end_id` that ended it) in place of its text tokenized
    again, where they spell that text exactly. Tokenizing the text again may split it into
    other tokens than the model sampled, and then vLLM's prefix cache would miss from that
    answer on and prefill it again on every later turn. The template renders a slot in place
    of each such text, and the text between slots is tokenized piece by piece: each piece ends
    where an earlier turn's prompt ended (at the generation prompt), so earlier prompts stay
    prefixes of later ones."""
    generated: list[list[int]] = []
    shown: list[dict[str, Any]] = []
    for message in messages:
        answer = _spelled_answer(tokenizer, message, end_id)
        if answer is not None:
            message = {**message, "content": [{"type": "text", "text": _SLOT.format(len(generated))}]}
            generated.append(answer)
        shown.append(message)
    pieces = _SLOT_PATTERN.split(_template_text(tokenizer, shown, tools, call_tool))  # text, slot, text, ...
    if pieces[1::2] != [str(i) for i in range(len(generated))] or any(_SLOT[0] in p for p in pieces[::2]):
        # the template did not show each slot once, or a message holds the slots' marks
        generated, pieces = [], [_template_text(tokenizer, messages, tools, call_tool)]
    ids: list[int] = []
    for i, piece in enumerate(pieces[::2]):
        ids += tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []
        ids += generated[i] if i < len(generated) else []
    return ids


def _template_text(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]],
                   tools: Sequence[dict[str, Any]], call_tool: bool) -> str:
    template_tools = [{"type": "function", "function": tool} for tool in tools] or None
    text = tokenizer.apply_chat_template(list(messages), tools=template_tools, add_generation_prompt=True,
                                         tokenize=False)
    return text + f"{CALL_OPEN}\n" if call_tool else text


def _spelled_answer(tokenizer: PreTrainedTokenizerBase, message: dict[str, Any], end_id: int) -> list[int] | None:
    """An assistant message's generated ids (without the `end_id` ending them), if they spell
    its one text part exactly (special tokens included: they must not enter the prompt)."""
    ids = list(message.get(GENERATED_IDS) or ())
    content = message.get("content")
    if not ids or message.get("tool_calls") or not isinstance(content, list) or len(content) != 1 \
            or content[0].get("type") != "text":
        return None
    if ids[-1] == end_id:
        ids.pop()
    return ids if ids and tokenizer.decode(ids) == content[0]["text"] else None


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    config: Qwen3OmniMoeConfig,
    messages: Sequence[dict[str, Any]],
    audio_features: Sequence[torch.Tensor],
    tools: Sequence[dict[str, Any]] = (),
    call_tool: bool = False,
    images: Sequence[ThinkerImage] = (),
) -> ThinkerPrompt:
    """`messages` use the chat-template shape ({'role', 'content'}; content parts of type
    'image', 'audio' or 'text'); `audio_features[i]` belongs to the i-th audio part, `images[i]`
    to the i-th image part. `tools` go to the checkpoint's template as OpenAI-style function
    tools; `call_tool` opens a tool call after the generation prompt, so the answer is the
    call's JSON. An assistant message's GENERATED_IDS go in as they are (`template_ids`)."""
    ids = template_ids(tokenizer, messages, tools, call_tool, config.im_end_token_id)
    thinker = config.thinker_config
    audio_sizes = [audio_token_count(f.shape[-1], thinker.audio_config.n_window) for f in audio_features]
    return expand_placeholders(ids, thinker.audio_token_id, thinker.image_token_id, audio_features, audio_sizes,
                               images)


def expand_placeholders(ids: list[int], audio_pad: int, image_pad: int, audio_features: Sequence[torch.Tensor],
                        audio_sizes: Sequence[int], images: Sequence[ThinkerImage]) -> ThinkerPrompt:
    """The prompt with each audio placeholder repeated `audio_sizes[i]` times and each image
    placeholder once per image token (as the checkpoint's processor expands them)."""
    for name, pad, inputs in (("audio", audio_pad, audio_features), ("image", image_pad, images)):
        if ids.count(pad) != len(inputs):
            raise ValueError(f"prompt has {ids.count(pad)} {name} placeholders but {len(inputs)} {name} inputs")
    sizes = {audio_pad: iter(audio_sizes), image_pad: iter([image.num_tokens for image in images])}
    expanded: list[int] = []
    for token in ids:
        expanded += [token] * next(sizes[token]) if token in sizes else [token]
    return ThinkerPrompt(input_ids=expanded, audio_features=list(audio_features), images=list(images),
                         audio_tokens=sum(audio_sizes))
