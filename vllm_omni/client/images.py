"""Images for the client: a file as the data URL an `input_image` part carries
(docs/realtime-api.md §4.5)."""

from __future__ import annotations

import base64
import mimetypes
from pathlib import Path


def image_data_url(path: str | Path) -> str:
    """`data:image/…;base64,…` of an image file; ValueError naming the file if it is none."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    kind = mimetypes.guess_type(path.name)[0]
    if kind is None or not kind.startswith("image/"):
        raise ValueError(f"{path}: not an image file (.png, .jpg, …)")
    return f"data:{kind};base64," + base64.b64encode(path.read_bytes()).decode()
