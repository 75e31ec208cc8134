"""Images on the wire: the checks an image passes before a session keeps it
(docs/realtime-api.md §4.5).

An `input_image` part carries a `data:image/jpeg;base64,` or `data:image/png;base64,` URL.
Its payload passes the checks a video frame passes: non-empty, at most 4 000 000 base64
characters, valid base64, and JPEG or PNG by its first bytes. Whether the model can decode
and use the picture is the engine's to say when it builds the prompt.
"""

from __future__ import annotations

import base64
import binascii

from vllm_omni.protocol.errors import ProtocolError

MAX_IMAGE_BASE64_CHARS = 4_000_000
DATA_URL_PREFIXES = ("data:image/jpeg;base64,", "data:image/png;base64,")
MAGIC = (b"\xff\xd8", b"\x89PNG")  # JPEG, PNG
MAX_FRAMES_PER_APPEND = 2  # a base frame and an optional composite (docs/realtime-api.md §13.8)


def frames_from_append(frames: object, max_slice_nums: object = None) -> list[bytes]:
    """The encoded images of an append's `video_frames` (bare base64; `null` entries skipped);
    `invalid_video_frames` naming the problem otherwise (docs/realtime-api.md §13.8)."""
    def problem(message: str, param: str = "video_frames") -> ProtocolError:
        return ProtocolError("invalid_video_frames", message, param)

    if max_slice_nums is not None and (max_slice_nums != 1 or isinstance(max_slice_nums, bool)):
        raise problem("max_slice_nums is not selectable on the wire: omit it or send 1 (frames are not "
                      "HD-sliced on request)", "max_slice_nums")
    if frames is None:
        return []
    if not isinstance(frames, list):
        raise problem("video_frames must be a list of base64-encoded images")
    given = [frame for frame in frames if frame is not None]
    if len(given) > MAX_FRAMES_PER_APPEND:
        raise problem(f"video_frames carries more than {MAX_FRAMES_PER_APPEND} frames for one append "
                      f"({len(given)}): send a base frame and at most one composite")
    if not all(isinstance(frame, str) for frame in given):
        raise problem("video_frames must be a list of base64-encoded images")
    decoded = []
    for frame in given:
        if not frame:
            raise problem("video_frames must be non-empty base64 strings")
        if frame.startswith("data:"):
            raise problem("video_frames must be bare base64 (no data: URL prefix)")
        if len(frame) > MAX_IMAGE_BASE64_CHARS:
            raise problem(f"a video frame exceeds 4MB base64 ({len(frame)} characters)")
        try:
            data = base64.b64decode(frame, validate=True)
        except (binascii.Error, ValueError):
            raise problem("video_frames must be valid base64") from None
        if not data.startswith(MAGIC):
            raise problem("video_frames must be JPEG or PNG images")
        decoded.append(data)
    return decoded


def image_from_data_url(url: object, where: str) -> bytes:
    """The encoded image an `input_image` part's `image_url` holds; `invalid_image` naming
    the problem (`where`: the field's path) otherwise."""
    if not isinstance(url, str) or not url:
        raise ProtocolError("invalid_image", "input_image needs an image_url", where)
    prefix = next((p for p in DATA_URL_PREFIXES if url.startswith(p)), None)
    if prefix is None:
        raise ProtocolError("invalid_image", "image_url must be a data:image/jpeg;base64, or "
                            "data:image/png;base64, URL (remote URLs are not fetched)", where)
    payload = url[len(prefix):]
    if not payload:
        raise ProtocolError("invalid_image", "image_url holds no image data", where)
    if len(payload) > MAX_IMAGE_BASE64_CHARS:
        raise ProtocolError("invalid_image", f"the image is {len(payload)} base64 characters; at most "
                            f"{MAX_IMAGE_BASE64_CHARS} (4MB) are allowed", where)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("invalid_image", "image_url's data must be valid base64", where) from None
    if not data.startswith(MAGIC):
        raise ProtocolError("invalid_image", "the image must be a JPEG or PNG image", where)
    return data
