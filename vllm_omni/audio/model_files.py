"""The audio models' ONNX files and sessions. Files never come from the network: a deploy may
name one; otherwise a pinned copy that an installed package ships is used. Every file must
match its pinned SHA-256, so a changed model is an error, not a silent change of behaviour."""

from __future__ import annotations

import hashlib
import importlib.metadata
import threading
from pathlib import Path
from typing import Self


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


class SharedOnnxModel:
    """A model file run by one single-threaded ONNX Runtime CPU session that every stream
    shares (per-stream state, if any, is passed in and out by the caller). Subclasses say where
    the file comes from (`resolve`); `load` builds each (class, file) once per process."""

    _instances: dict[tuple[type, Path], SharedOnnxModel] = {}
    _lock = threading.Lock()

    def __init__(self, path: Path):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.path = path
        self._session = onnxruntime.InferenceSession(str(path), sess_options=options,
                                                     providers=["CPUExecutionProvider"])

    @classmethod
    def resolve(cls, configured_path: str | None) -> Path:
        raise NotImplementedError

    @classmethod
    def load(cls, configured_path: str | None = None) -> Self:
        key = (cls, cls.resolve(configured_path))
        with cls._lock:
            if key not in cls._instances:
                cls._instances[key] = cls(key[1])
            return cls._instances[key]
