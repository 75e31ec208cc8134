"""Images in conversation items, on the scripted engine: an `input_image` part's checks, what
the history keeps, what the engine gets, and what the session reports."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.scripted_engine import ScriptedEngine, turn_session
from vllm_omni.protocol.images import MAX_IMAGE_BASE64_CHARS
from vllm_omni.session.item_store import MAX_HISTORY_IMAGE_BYTES, MAX_HISTORY_IMAGES


def png(color: tuple[int, int, int] = (200, 30, 30), size: tuple[int, int] = (32, 32)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def image_item(*urls: str, text: str | None = None, role: str = "user") -> dict:
    content = [{"type": "input_image", "image_url": url} for url in urls]
    if text is not None:
        content.append({"type": "input_text", "text": text})
    return {"type": "conversation.item.create", "event_id": "e",
            "item": {"type": "message", "role": role, "content": content}}


async def test_an_image_item_enters_the_history_and_reaches_the_engine() -> None:
    session, engine, events = turn_session()
    red, blue = png(), png((20, 20, 220))
    await session.handle(image_item(data_url(red), data_url(blue), text="Which is warmer?"))
    done = events.last("conversation.item.done")["item"]
    assert done["content"] == [{"type": "input_image", "image_url": data_url(red)},
                               {"type": "input_image", "image_url": data_url(blue)},
                               {"type": "input_text", "text": "Which is warmer?"}]
    await session.handle({"type": "conversation.item.retrieve", "item_id": done["id"]})
    assert events.last("conversation.item.retrieved")["item"]["content"] == done["content"]
    await session.handle({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await events.wait("response.done")
    (message,) = engine.requests[0].messages
    assert (message.role, message.text, message.images) == ("user", "Which is warmer?", [red, blue])


async def test_an_image_alone_is_a_turn_and_an_inline_image_stays_out_of_the_history() -> None:
    session, engine, events = turn_session()
    await session.handle(image_item(data_url(png(), "png")))
    jpeg = io.BytesIO()
    Image.new("RGB", (16, 16)).save(jpeg, "JPEG")
    inline = image_item(data_url(jpeg.getvalue(), "jpeg"), text="And this?")["item"]
    await session.handle({"type": "response.create", "response": {"input": [inline], "output_modalities": ["text"]}})
    await events.wait("response.done")
    assert [len(m.images) for m in engine.requests[0].messages] == [1]  # only the inline item: no history
    assert [len(i.images) for i in session.items.conversation.items] == [1, 0]  # the image turn, the answer
    await session.handle({"type": "response.create", "response": {"output_modalities": ["text"]}})
    await events.wait("response.done", 2)
    assert engine.requests[1].messages[0].images == [png()] and not events.errors()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize(("url", "message"), [
    ("https://example.com/cat.png", "must be a data:image/jpeg;base64, or data:image/png;base64, URL"),
    ("data:image/gif;base64," + _b64(b"GIF89a"), "must be a data:image/jpeg;base64,"),
    ("data:image/png;base64,", "holds no image data"),
    ("data:image/png;base64,***", "must be valid base64"),
    ("data:image/png;base64," + _b64(b"hello, not a picture"), "must be a JPEG or PNG image"),
    ("data:image/png;base64," + "A" * (MAX_IMAGE_BASE64_CHARS + 4), "at most 4000000 (4MB)"),
    (None, "needs an image_url"),
])
async def test_a_bad_image_url_is_refused_naming_the_problem(url: str | None, message: str) -> None:
    session, _, events = turn_session()
    await session.handle(image_item(url, text="See?"))
    error = events.last("error")["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("invalid_image", "item.content.0.image_url", "e")
    assert message in error["message"]
    assert not session.items.conversation.items


async def test_images_belong_in_user_messages() -> None:
    session, _, events = turn_session()
    await session.handle(image_item(data_url(png()), role="assistant"))
    error = events.last("error")["error"]
    assert (error["code"], error["param"]) == ("invalid_image", "item.content.0")
    assert "user messages, not assistant ones" in error["message"]


async def test_a_model_without_image_input_says_so() -> None:
    session, _, events = turn_session(ScriptedEngine(accepts_images=False))
    assert session.capabilities()["supports_image_input"] is False
    await session.handle(image_item(data_url(png())))
    error = events.last("error")["error"]
    assert (error["code"], error["param"]) == ("unsupported", "item.content.0")
    assert turn_session()[0].capabilities()["supports_image_input"] is True


async def test_the_history_keeps_a_bounded_number_of_images() -> None:
    session, _, events = turn_session()
    for shade in range(MAX_HISTORY_IMAGES):
        await session.handle(image_item(data_url(png((shade, 0, 0)))))
    await session.handle(image_item(data_url(png((0, 0, 99))), text="one more"))
    error = events.last("error")["error"]
    assert error["code"] == "input_backpressure" and "delete old items" in error["message"]
    assert len(session.items.conversation.items) == MAX_HISTORY_IMAGES
    await session.handle({"type": "conversation.item.delete", "item_id": session.items.conversation.items[0].id})
    await session.handle(image_item(data_url(png((0, 0, 99))), text="one more"))
    assert events.errors() == ["input_backpressure"]
    assert session.items.conversation.items[-1].text == "one more"


async def test_the_history_keeps_a_bounded_size_of_images() -> None:
    session, _, events = turn_session()
    big = png(size=(1, 1)) + b"\0" * (MAX_HISTORY_IMAGE_BYTES // 2)  # checked as a PNG by its first bytes only
    await session.handle(image_item(data_url(big)))
    await session.handle(image_item(data_url(big)))
    assert events.errors() == ["input_backpressure"] and len(session.items.conversation.items) == 1
