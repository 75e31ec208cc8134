"""WAV files for the client: 16 kHz mono 16-bit PCM in, any rate of 16-bit PCM out.

Invalid input raises `WavError` with a one-line message naming the file and what is wrong.
"""

from __future__ import annotations

import base64
import io
import wave
from pathlib import Path

INPUT_RATE = 16000  # what this library sends: 16 kHz mono PCM16, declared on every append


class WavError(ValueError):
    pass


def _open(source: Path | io.BytesIO, name: str) -> wave.Wave_read:
    if isinstance(source, Path) and not source.is_file():
        raise WavError(f"{name}: no such file")
    try:
        return wave.open(source if isinstance(source, io.BytesIO) else str(source), "rb")
    except wave.Error as exc:  # compressed formats, other containers, truncated headers
        raise WavError(f"{name}: not an uncompressed PCM WAV file ({exc})") from None
    except EOFError:
        raise WavError(f"{name}: truncated WAV file") from None


def read_pcm16(source: str | Path | bytes, name: str | None = None) -> bytes:
    """The samples of a 16 kHz mono 16-bit PCM WAV file (a path, or the file's bytes), as
    little-endian bytes; `name` names it in errors (default: the path)."""
    opened = io.BytesIO(source) if isinstance(source, bytes) else Path(source)
    name = name or str(opened)
    with _open(opened, name) as wav:
        problems = []
        if wav.getnchannels() != 1:
            problems.append(f"{wav.getnchannels()} channels (need mono)")
        if wav.getsampwidth() != 2:
            problems.append(f"{8 * wav.getsampwidth()}-bit samples (need 16-bit)")
        if wav.getframerate() != INPUT_RATE:
            problems.append(f"{wav.getframerate()} Hz (need {INPUT_RATE} Hz)")
        if problems:
            raise WavError(f"{name}: {', '.join(problems)}")
        frames = wav.readframes(wav.getnframes())
    if not frames:
        raise WavError(f"{name}: no audio samples")
    return frames


def write_pcm16(target: str | Path | io.BytesIO, pcm: bytes, sample_rate: int) -> None:
    with wave.open(target if isinstance(target, io.BytesIO) else str(target), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(pcm)


def wav_bytes(pcm16: bytes, sample_rate: int = INPUT_RATE) -> bytes:
    """Mono PCM16 as the bytes of a WAV file."""
    buffer = io.BytesIO()
    write_pcm16(buffer, pcm16, sample_rate)
    return buffer.getvalue()


def wav_data_url(path: str | Path) -> str:
    """A 16 kHz mono PCM16 WAV file as a `data:audio/wav;base64,` URL (e.g. `ref_audio`)."""
    return "data:audio/wav;base64," + base64.b64encode(wav_bytes(read_pcm16(path))).decode()
