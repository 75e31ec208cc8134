"""Ask a turn-based omni checkpoint (Qwen3-Omni, Qwen2.5-Omni) something (text or a WAV) and write
its spoken answer to a WAV.

    .venv/bin/python examples/offline_speech.py --model .models/qwen3_omni_tiny \\
        --deploy-config configs/qwen3_omni_tiny_cpu.yaml --wav question.wav --out answer.wav
"""

from __future__ import annotations

import argparse
import wave

import numpy as np

from vllm_omni import Omni
from vllm_omni.engine import Message, OmniRequest


def read_wav_16k_mono(path: str) -> np.ndarray:
    with wave.open(path) as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (16000, 1, 2):
            raise SystemExit(f"{path}: need a 16 kHz mono 16-bit PCM WAV")
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--deploy-config", required=True)
    parser.add_argument("--wav", help="spoken question (16 kHz mono WAV)")
    parser.add_argument("--text", default=None, help="typed question (with or instead of --wav)")
    parser.add_argument("--speaker", default="ethan")
    parser.add_argument("--out", default="answer.wav")
    args = parser.parse_args()
    if not args.wav and not args.text:
        parser.error("give --wav, --text or both")

    audio = read_wav_16k_mono(args.wav) if args.wav else None
    request = OmniRequest([Message("user", text=args.text, audio=audio)], speaker=args.speaker)
    with Omni(args.model, args.deploy_config) as omni:
        result = omni.generate(request)[0]
    print(f"text: {result.text!r}")
    with wave.open(args.out, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(result.sample_rate or 24000)
        out.writeframes(result.audio.astype("<i2").tobytes())
    print(f"wrote {args.out}: {len(result.audio) / (result.sample_rate or 24000):.2f} s of speech")


if __name__ == "__main__":
    main()
