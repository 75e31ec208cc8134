"""Where a checkpoint's files are: a local folder, or a Hugging Face name's snapshot in the
local cache (nothing downloads at run time)."""

from __future__ import annotations

from pathlib import Path


def local_checkpoint_dir(model: str | Path) -> Path:
    folder = Path(model)
    if folder.is_dir():
        return folder
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(model), local_files_only=True))
