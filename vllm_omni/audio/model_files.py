"""Where the audio models' ONNX files come from: never the network. A deploy may name a file;
otherwise a pinned copy that an installed package ships is used. Every file must match its
pinned SHA-256, so a changed model is an error, not a silent change of behaviour."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path


class ModelFileUnavailableError(RuntimeError):
    """No usable local copy of a model file (missing, or not the pinned one)."""


def checked(path: Path, sha256: str, what: str) -> Path:
    """`path`, if it holds the pinned file."""
    if hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        raise ModelFileUnavailableError(f"{what} checksum mismatch: {path}")
    return path


def configured(path: str, sha256: str, what: str) -> Path:
    """A file a deploy configured, checked."""
    file = Path(path)
    if not file.is_file():
        raise ModelFileUnavailableError(f"Configured {what} model does not exist: {file}")
    return checked(file, sha256, what)


def packaged(distribution: str, relative_path: str) -> Path | None:
    """The file `relative_path` inside the installed `distribution` (None if either is absent);
    found through the package metadata, so the package itself is never imported."""
    try:
        located = Path(str(importlib.metadata.distribution(distribution).locate_file(relative_path)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return located if located.is_file() else None
