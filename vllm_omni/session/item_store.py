"""The conversation of a turn-mode session: items clients create, delete, retrieve and
truncate, items the session adds, and the cap on the user speech it keeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from vllm_omni.audio.formats import AudioFormat, check_rate, decode_base64, decode_to_model_rate
from vllm_omni.audio.pcm import AudioDataError
from vllm_omni.audio.silero_vad import samples_to_ms
from vllm_omni.engine.interface import EngineClient
from vllm_omni.engine.request import ToolCall
from vllm_omni.protocol import client_events as ce
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.images import image_from_data_url
from vllm_omni.protocol.server_event_builders import (
    audio_buffer_committed,
    item_deleted,
    item_done,
    item_retrieved,
    item_truncated,
)
from vllm_omni.protocol.server_events import new_id
from vllm_omni.protocol.session_config import parse_format
from vllm_omni.session.base import Emit
from vllm_omni.session.conversation import Conversation, Item, ItemImage, announce
from vllm_omni.session.input_track import MIN_TURN_AUDIO_MS, MIN_TURN_SAMPLES

# Images a conversation keeps at most (docs/realtime-api.md §4.5): by count and encoded bytes
MAX_HISTORY_IMAGES = 8
MAX_HISTORY_IMAGE_BYTES = 4 * 1024 * 1024
# The verb of GA's message for an unknown item, per action (its code: item_<action>_invalid_item_id)
NOT_FOUND = {"delete": "deleting", "retrieve": "retrieving", "truncate": "truncating"}


class ItemStore:
    """`input_format` gives the session's input format: item audio without a format of its own
    is in it (as GA has it)."""

    def __init__(self, engine: EngineClient, emit: Emit, *, session_id: str, max_history_audio_ms: int,
                 input_format: Callable[[], AudioFormat]):
        self.engine = engine
        self._emit = emit
        self.session_id = session_id
        self.max_history_audio_ms = max_history_audio_ms
        self._input_format = input_format
        self.conversation = Conversation()

    # Client events ------------------------------------------------------------------------

    async def create(self, ev: ce.ConversationItemCreate) -> Item:
        """conversation.item.create."""
        if ev.item is None:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'item'.", "item")
        item = await self.build(ev.item, "item", unique=True)
        self._check_image_room(item)
        previous = self.add(item, ev.previous_item_id)
        announce(self._emit, previous, item)
        if item.stream is not None:
            self._emit(audio_buffer_committed(previous_item_id=previous, item_id=item.id))
        self._emit(item_done(previous_item_id=previous, item=item.to_wire()))
        return item

    async def build(self, raw: ce.ItemPayload, where: str, *, unique: bool = False) -> Item:
        """A message item from its payload (`where`: its field path), its audio turned into
        features; `unique`: its id must not be taken."""
        if unique and raw.id is not None and self.conversation.find(raw.id) is not None:
            raise ProtocolError("bad_event", f"an item with id {raw.id!r} already exists", f"{where}.id")
        if raw.type != "message":
            return self._function_item(raw, where)
        item = Item(id=raw.id or new_id("item_"), role=raw.role)
        texts, audio = [], []
        for index, part in enumerate(raw.content):
            at = f"{where}.content.{index}"
            if isinstance(part, ce.TextPart):
                texts.append(part.text)
            elif isinstance(part, ce.ImagePart):
                item.images.append(self._image(part, raw.role, at))
            elif raw.role != "user":
                raise ProtocolError("bad_event", f"{raw.role} items cannot carry audio", at)
            else:
                audio.append(_part_audio(part, at, self._input_format()))
                item.transcript = part.transcript or item.transcript
        item.text = "".join(texts) or None
        if audio:
            samples = np.concatenate(audio)
            if samples.size < MIN_TURN_SAMPLES:
                raise ProtocolError("bad_audio", f"item audio is {samples_to_ms(samples.size)} ms long; at least "
                                    f"{MIN_TURN_AUDIO_MS} ms is required", f"{where}.content")
            item.stream = self.engine.create_audio_stream()
            await asyncio.to_thread(item.stream.append, samples)  # features of a long clip: off the event loop
            item.audio_ms = samples_to_ms(samples.size)
        return item

    def _image(self, part: ce.ImagePart, role: str, where: str) -> ItemImage:
        if role != "user":
            raise ProtocolError("invalid_image", f"input_image parts belong in user messages, not {role} ones", where)
        if not self.engine.accepts_images:
            raise ProtocolError("unsupported", "this model does not take image input", where)
        return ItemImage(url=part.image_url, data=image_from_data_url(part.image_url, f"{where}.image_url"))

    def _check_image_room(self, item: Item) -> None:
        """The history keeps at most MAX_HISTORY_IMAGES images of MAX_HISTORY_IMAGE_BYTES in all."""
        if not item.images:
            return
        held = [image for kept in self.conversation.items for image in kept.images] + item.images
        size = sum(len(image.data) for image in held)
        if len(held) > MAX_HISTORY_IMAGES or size > MAX_HISTORY_IMAGE_BYTES:
            raise ProtocolError("input_backpressure", f"with this item the conversation would hold {len(held)} images "
                                f"({size} bytes); it keeps at most {MAX_HISTORY_IMAGES} images of "
                                f"{MAX_HISTORY_IMAGE_BYTES // (1024 * 1024)} MiB in all: delete old items first",
                                "item.content")

    def _function_item(self, raw: ce.ItemPayload, where: str) -> Item:
        """A function_call (the client records one) or a function_call_output (the result of a
        call the model made in this conversation)."""
        if not raw.call_id:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'call_id'.",
                                f"{where}.call_id")
        item_id = raw.id or new_id("item_")
        if raw.type == "function_call":
            if not raw.name:
                raise ProtocolError("missing_required_parameter", "Missing required parameter: 'name'.",
                                    f"{where}.name")
            return Item(id=item_id, role="assistant", type="function_call",
                        call=ToolCall(raw.call_id, raw.name, raw.arguments or "{}"))
        if self.conversation.find_call(raw.call_id) is None:
            raise ProtocolError("invalid_function_call_output", f"no function call in this conversation has call_id "
                                f"{raw.call_id!r}", f"{where}.call_id")
        if raw.output is None:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'output'.",
                                f"{where}.output")
        return Item(id=item_id, role="tool", type="function_call_output", call=ToolCall(raw.call_id, "", ""),
                    output=raw.output)

    async def response_input(self, entries: list[ce.InputItemReference | ce.ItemPayload]) -> list[Item]:
        """A response.create `input`: references name conversation items, inline items are
        built for the response only (they do not enter the conversation)."""
        items = []
        for index, entry in enumerate(entries):
            where = f"response.input.{index}"
            if isinstance(entry, ce.InputItemReference):
                item = self.conversation.find(entry.id)
                if item is None:
                    raise ProtocolError("item_not_found", f"Conversation item not found: {entry.id}", f"{where}.id")
                items.append(item)
            else:
                items.append(await self.build(entry, where))
        return items

    def delete(self, ev: ce.ItemReference) -> None:
        item = self.get(ev.item_id, "delete")
        self.conversation.remove(item.id)
        self._emit(item_deleted(session_id=self.session_id, item_id=item.id))

    def retrieve(self, ev: ce.ItemReference) -> None:
        self._emit(item_retrieved(item=self.get(ev.item_id).to_wire()))

    def truncate(self, ev: ce.ConversationItemTruncate) -> tuple[Item, int]:
        """conversation.item.truncate of an assistant item's audio; returns the item and the
        kept audio (ms) for the response's playback ledger."""
        item = self.get(ev.item_id, "truncate")
        if item.role != "assistant" or item.type != "message":
            raise ProtocolError("invalid_value", "conversation.item.truncate only supports assistant message items",
                                "item_id")
        if ev.content_index != 0:
            raise ProtocolError("invalid_value", "conversation.item.truncate content_index out of range",
                                "content_index")
        if ev.audio_end_ms is None:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'audio_end_ms'.",
                                "audio_end_ms")
        end = int(ev.audio_end_ms)
        if end > item.audio_duration_ms:
            raise ProtocolError("invalid_value", f"audio_end_ms ({end}) exceeds the item's audio duration "
                                f"({item.audio_duration_ms} ms)", "audio_end_ms")
        self._emit(item_truncated(session_id=self.session_id, item_id=item.id, audio_end_ms=end))
        return item, end

    # Session side -------------------------------------------------------------------------

    def get(self, item_id: str | None, action: str = "retrieve") -> Item:
        """The item a client event of `action` (delete, retrieve, truncate) names."""
        if not item_id:
            raise ProtocolError("missing_required_parameter", "Missing required parameter: 'item_id'.", "item_id")
        item = self.conversation.find(item_id)
        if item is None:
            raise ProtocolError(f"item_{action}_invalid_item_id",
                                f"Error {NOT_FOUND[action]} item: the item with id '{item_id}' does not exist.",
                                "item_id")
        return item

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert `item` after `previous_item_id` (None: at the end, "root": first); user speech
        beyond the cap leaves the history oldest-first. Returns the id of the item before it."""
        previous = self._insert(item, previous_item_id)
        self.conversation.drop_oldest_audio(self.max_history_audio_ms)
        return previous

    def _insert(self, item: Item, previous_item_id: str | None) -> str | None:
        if previous_item_id is None:
            return self.conversation.add(item)
        if previous_item_id == "root":
            self.conversation.items.insert(0, item)
            return None
        anchor = self.conversation.find(previous_item_id)
        if anchor is None:
            raise ProtocolError("item_not_found", f"Conversation item not found: {previous_item_id}",
                                "previous_item_id")
        self.conversation.items.insert(self.conversation.items.index(anchor) + 1, item)
        return previous_item_id

    def clear(self) -> None:
        self.conversation.items.clear()


def _part_audio(part: ce.AudioPart, where: str, session_format: AudioFormat) -> np.ndarray:
    """One audio part (in the session's format unless it names its own) decoded to 16 kHz
    samples; empty parts are refused."""
    fmt = parse_format(part.format, output=False, param=f"{where}.format") if part.format is not None \
        else session_format
    try:
        rate = check_rate(part.sample_rate_hz)
        if rate is not None:
            fmt = AudioFormat(fmt.name, rate)
        samples = decode_to_model_rate(decode_base64(part.audio or part.data or ""), fmt)
    except AudioDataError as exc:
        raise ProtocolError("bad_audio", str(exc), f"{where}.audio") from None
    except ValueError as exc:
        raise ProtocolError("bad_event", str(exc), f"{where}.sample_rate_hz") from None
    if samples.size == 0:
        raise ProtocolError("bad_audio", "item audio is empty", f"{where}.audio")
    return samples
