"""Latency of the staged pipeline against plain transformers `generate`, in one run.

For a spoken answer of at least `--min-audio-s` seconds, measures time to the first audio
chunk and total time with async_chunk on and off, for each deploy config (by default every
stage on torch, then thinker and talker on vLLM), and transformers'
`generate(return_audio=True)` (which returns audio only at the end), all on the same
checkpoint and input. Also measures the cost of one code2wav chunk with exact streaming
(state carried between chunks) against the reference's re-decode with 25 frames of left
context.

    .venv/bin/python benchmarks/pipeline_latency.py [--model DIR] [--out results.json]

Without --model it builds the tiny checkpoint into .models/qwen3_omni_tiny.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import wave
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_omni.config import get_deploy_config_path, load_deploy_config  # noqa: E402
from vllm_omni.engine import AudioChunk, Message, OmniEngine, OmniRequest, RequestFinished  # noqa: E402
from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint  # noqa: E402
from vllm_omni.models.qwen3_omni.family import Qwen3OmniFamily  # noqa: E402
from vllm_omni.models.qwen3_omni.torch_backend.code2wav import make_code2wav_stream  # noqa: E402

FRAME_S = 0.08


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as wav:
        if wav.getframerate() != 16000 or wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise SystemExit(f"{path}: need 16 kHz mono 16-bit PCM")
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    return samples[: len(samples) // 160 * 160].astype(np.float32) / 32768.0


async def time_engine(engine: OmniEngine, audio: np.ndarray, thinker: int, talker: int) -> dict:
    request = OmniRequest([Message("user", audio=audio)],
                          sampling={"thinker": {"max_tokens": thinker}, "talker": {"max_tokens": talker}})
    start = time.perf_counter()
    first_audio, chunks = None, 0
    async for output in engine.generate(request):
        if isinstance(output, AudioChunk):
            chunks += 1
            first_audio = first_audio or time.perf_counter() - start
        elif isinstance(output, RequestFinished):
            if output.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"request failed: {output.error}")
            return {"first_audio_s": first_audio, "total_s": time.perf_counter() - start,
                    "audio_s": output.audio_duration_s, "chunks": chunks}
    raise RuntimeError("no final output")


def time_transformers(checkpoint, audio: np.ndarray, thinker: int, talker: int) -> dict:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(checkpoint.path)
    prompt = processor.apply_chat_template([{"role": "user", "content": [{"type": "audio"}]}],
                                           add_generation_prompt=True, tokenize=False)
    start = time.perf_counter()
    inputs = processor(text=prompt, audio=[audio], return_tensors="pt")
    _, waveform = checkpoint.model.generate(**inputs, return_audio=True, thinker_do_sample=False,
                                            thinker_max_new_tokens=thinker, talker_do_sample=False,
                                            talker_max_new_tokens=talker)
    total = time.perf_counter() - start
    return {"first_audio_s": total, "total_s": total, "audio_s": waveform.numel() / 24000, "chunks": 1}


def time_code2wav_chunks(checkpoint, frames: int = 200, chunk: int = 25) -> dict:
    codes = torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(0))
    result = {}
    for mode in ("exact", "left_context"):
        stream = make_code2wav_stream(checkpoint.code2wav, mode, left_context=25)
        stream.decode(codes[:, :chunk])  # warm-up chunk from frame 0
        times = []
        for start in range(chunk, frames, chunk):
            began = time.perf_counter()
            stream.decode(codes[:, start:start + chunk])
            times.append(time.perf_counter() - began)
        result[mode] = statistics.median(times)
    return result


def median_runs(runs: list[dict]) -> dict:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint folder (default: build the tiny one)")
    parser.add_argument("--deploy-configs", default="qwen3_omni_tiny_cpu_torch,qwen3_omni_tiny_cpu",
                        help="comma-separated bundled config names, measured in this order")
    parser.add_argument("--wav", default=str(REPO / "tests/data/speech_en_single.wav"))
    parser.add_argument("--thinker-tokens", type=int, default=32)
    parser.add_argument("--min-audio-s", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/pipeline_latency.json"))
    args = parser.parse_args()

    model = args.model
    if model is None:
        from vllm_omni.models.qwen3_omni.tiny.checkpoint import build_tiny_checkpoint

        model = str(REPO / ".models/qwen3_omni_tiny")
        if not (Path(model) / "model.safetensors").is_file():
            build_tiny_checkpoint(model)
    audio = read_wav(Path(args.wav))
    # The talker's last token gets no frame; the decoder's look-ahead costs 555 samples.
    talker_tokens = int(np.ceil((args.min_audio_s + 555 / 24000) / FRAME_S)) + 1
    checkpoint = load_checkpoint(model)

    results: dict[str, dict] = {}
    for config_name in args.deploy_configs.split(","):
        deploy = load_deploy_config(get_deploy_config_path(config_name), platform="cpu")
        backends = "/".join(stage.backend for stage in deploy.stages)
        engine = OmniEngine(Qwen3OmniFamily(checkpoint, deploy))
        try:
            for async_chunk in (True, False):
                engine.family.set_async_chunk(async_chunk)
                asyncio.run(time_engine(engine, audio, args.thinker_tokens, talker_tokens))  # warm-up
                runs = [asyncio.run(time_engine(engine, audio, args.thinker_tokens, talker_tokens))
                        for _ in range(args.repeats)]
                results[f"{backends}, async_chunk {'on' if async_chunk else 'off'}"] = median_runs(runs)
        finally:
            engine.shutdown()
    time_transformers(checkpoint, audio, args.thinker_tokens, talker_tokens)  # warm-up
    results["transformers generate"] = median_runs(
        [time_transformers(checkpoint, audio, args.thinker_tokens, talker_tokens) for _ in range(args.repeats)])
    chunk_cost = time_code2wav_chunks(checkpoint)

    print(f"\nmodel: {model}\nanswer: {args.thinker_tokens} text tokens, {talker_tokens} codec tokens; "
          f"median of {args.repeats} runs\n")
    print(f"{'':34s} {'first audio (s)':>16s} {'total (s)':>10s} {'audio (s)':>10s} {'chunks':>7s}")
    for name, row in results.items():
        print(f"{name:34s} {row['first_audio_s']:16.3f} {row['total_s']:10.3f} {row['audio_s']:10.2f} "
              f"{row['chunks']:7.0f}")
    print(f"\ncode2wav, one 25-frame chunk: exact streaming {chunk_cost['exact'] * 1000:.1f} ms, "
          f"reference re-decode with 25 frames of left context {chunk_cost['left_context'] * 1000:.1f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": model, "thinker_tokens": args.thinker_tokens,
                               "talker_tokens": talker_tokens, "repeats": args.repeats,
                               "pipeline": results, "code2wav_chunk_s": chunk_cost}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
