"""Conversation items of a session and how they become an engine request's messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_omni.engine.request import AudioInputStream, Message, ToolCall
from vllm_omni.protocol.server_event_builders import item_added, item_created
from vllm_omni.session.base import Emit


@dataclass(frozen=True)
class ItemImage:
    url: str  # the data URL the client sent, as the item's events show it
    data: bytes  # the encoded JPEG or PNG the model gets


@dataclass
class Item:
    id: str
    role: str  # user | assistant | system (for messages)
    status: str = "completed"
    type: str = "message"  # | function_call | function_call_output
    call: ToolCall | None = None  # of a function_call, or the call_id (name, arguments empty) of an output
    output: str = ""  # a function_call_output's result
    text: str | None = None  # typed text (user/system) or the spoken transcript (assistant)
    stream: AudioInputStream | None = None  # user speech as features, computed while it arrived
    audio_ms: int = 0  # how much user speech the item was given
    transcript: str = ""  # user audio transcript (client hints; no ASR runs)
    is_speech: bool = True  # False: the empty turn of a silent commit (docs/realtime-api.md §13.6)
    images: list[ItemImage] = field(default_factory=list)  # a user message's pictures, in order
    audio_duration_ms: int = 0  # assistant audio generated
    text_cap_chars: int | None = None  # hard cap from truncation / barge-in
    token_ids: tuple[int, ...] = ()  # an answer's: the ids the model generated for `text` (engine Message)
    awaiting_ack: bool = False  # ack_only: spoken, but not yet acknowledged as heard in full
    heard_chars: int = 0  # while awaiting_ack: the text acknowledged so far (models with text–audio marks)

    @property
    def kept_text(self) -> str:
        text = self.text or ""
        if self.awaiting_ack:
            text = text[: self.heard_chars]
        return text if self.text_cap_chars is None else text[: self.text_cap_chars]

    @property
    def held_audio_ms(self) -> int:
        """User speech this item still holds for prompts (0 once it left the history)."""
        return self.audio_ms if self.stream is not None else 0

    def to_wire(self) -> dict[str, Any]:
        if self.type == "function_call":
            return {"id": self.id, "object": "realtime.item", "type": "function_call", "status": self.status,
                    "call_id": self.call.call_id, "name": self.call.name, "arguments": self.call.arguments}
        if self.type == "function_call_output":
            return {"id": self.id, "object": "realtime.item", "type": "function_call_output", "status": self.status,
                    "call_id": self.call.call_id, "output": self.output}
        content: list[dict[str, Any]] = []
        if self.role == "assistant":
            if self.status != "in_progress":  # an open assistant item has no parts yet
                content.append({"type": "output_audio", "transcript": self.kept_text,
                                "audio_duration_ms": self.audio_duration_ms})
        else:
            content += [{"type": "input_image", "image_url": image.url} for image in self.images]
            if self.audio_ms:
                content.append({"type": "input_audio", "transcript": self.transcript})
            elif not self.is_speech:
                content.append({"type": "input_audio", "transcript": "", "is_speech": False})
            if self.text:
                content.append({"type": "input_text", "text": self.text})
        return {"id": self.id, "object": "realtime.item", "type": "message", "role": self.role,
                "status": self.status, "content": content}


@dataclass
class Conversation:
    items: list[Item] = field(default_factory=list)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item) -> str | None:
        """Append; return the previous item's id."""
        previous = self.last_id()
        self.items.append(item)
        return previous

    def find(self, item_id: str) -> Item | None:
        return next((item for item in self.items if item.id == item_id), None)

    def find_call(self, call_id: str) -> Item | None:
        """The function_call item with `call_id`."""
        return next((item for item in self.items if item.type == "function_call" and item.call.call_id == call_id),
                    None)

    def remove(self, item_id: str) -> bool:
        item = self.find(item_id)
        if item is not None:
            self.items.remove(item)
        return item is not None

    def drop_oldest_audio(self, max_ms: int) -> list[Item]:
        """Keep at most `max_ms` of user speech: the oldest items lose theirs first (their
        text stays), as the oldest turns leave a prompt that outgrows the context. The
        newest item keeps its audio. Returns the items that lost audio."""
        held = sum(item.held_audio_ms for item in self.items)
        dropped = []
        for item in self.items[:-1]:
            if held <= max_ms:
                break
            if item.held_audio_ms:
                held -= item.held_audio_ms
                item.stream = None
                dropped.append(item)
        return dropped


# A user turn that says nothing: the chat template answers a user turn, so a response to a
# conversation that does not end with one (greet-first, or another reply after an answer) gets
# this blank turn (docs/realtime-api.md §4.8). A space, as the engine refuses an empty turn.
BLANK_USER_TURN = " "


def prompt_messages(instructions: str | None, items: list[Item]) -> list[Message]:
    """The engine's view of `items`: system instructions, then every turn that says something,
    ending with a user turn or a tool result. A function call joins the assistant turn before it."""
    messages = [Message("system", text=instructions)] if instructions else []
    for item in items:
        if item.type == "function_call":
            if not messages or messages[-1].role != "assistant":
                messages.append(Message("assistant"))
            messages[-1].tool_calls.append(item.call)
        elif item.type == "function_call_output":
            messages.append(Message("tool", text=item.output, tool_call_id=item.call.call_id))
        elif item.role == "assistant":
            if item.kept_text:
                messages.append(Message("assistant", text=item.kept_text, token_ids=item.token_ids))
        elif item.role == "system":
            if item.text:
                messages.append(Message("system", text=item.text))
        elif item.stream is not None or item.text or item.images:
            messages.append(Message("user", text=item.text, audio_stream=item.stream,
                                    images=[image.data for image in item.images]))
    if not messages or messages[-1].role not in ("user", "tool"):
        messages.append(Message("user", text=BLANK_USER_TURN))
    return messages


def announce(emit: Emit, previous_item_id: str | None, item: Item) -> None:
    """A new item's `conversation.item.added` and its beta spelling `conversation.item.created`."""
    emit(item_added(previous_item_id=previous_item_id, item=item.to_wire()))
    emit(item_created(previous_item_id=previous_item_id, item=item.to_wire()))
