"""code2wav batched across streams against one stream at a time, paired, on one torch thread.

    .venv/bin/python benchmarks/code2wav_batching.py [--model DIR | --full-size] [--streams 1 4 8 16]

S streams decode the ramped chunk schedule the talker -> code2wav connector cuts (1, 1, 1,
1, 2, 3, 4, 6, 9, ... frames, up to 25: `CodecChunker`), one chunk per stream per round,
as the code2wav stage worker steps them: A = `decode` per stream (the stage before
batching), B = one `decode_batch` per round (engine/backends/step_worker.py hands a
round to `step_batch`). Two arrivals: `aligned` (every stream starts in round 0, the case
of many sessions answering at once) and `staggered` (stream i starts in round i mod 4, so
a round holds four different chunk sizes and its conv passes are shared by a quarter of
the streams each). Runs go in ABBA order, `--pairs` times, each with fresh streams; the
table gives the median over runs of the mean wall time per round, of the rounds until
every stream has sent its first second of audio, and B's speedup. One torch thread, as
the server runs torch stages (`server_torch_threads: 1`).

`--full-size` decodes with a randomly initialised code2wav of Qwen3-Omni's real shape
(transformers' default `Qwen3OmniMoeCode2WavConfig`) instead of the checkpoint's: the
timing of the real decoder, without its weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (  # noqa: E402
    Qwen3OmniMoeCode2WavConfig,
)
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav  # noqa: E402

from vllm_omni.config import CodecChunking  # noqa: E402
from vllm_omni.models.qwen3_omni.checkpoint import load_checkpoint  # noqa: E402
from vllm_omni.models.qwen3_omni.family import CodecChunker  # noqa: E402
from vllm_omni.models.qwen3_omni.torch_backend.code2wav import ExactCode2WavStream, decode_batch  # noqa: E402

FRAME_S = 0.08  # one codec frame of audio
STAGGER_COHORTS = 4
Decoder = Callable[[list[ExactCode2WavStream], list[torch.Tensor]], list[torch.Tensor]]


def ramp_schedule(max_frames: int, initial: int, largest: int) -> list[int]:
    """The chunk sizes `CodecChunker` cuts from `max_frames` frames (the last one cut short)."""
    chunker = CodecChunker(CodecChunking(initial_codec_chunk_frames=initial, codec_chunk_frames=largest),
                           streaming=True)
    sizes = [chunk.shape[1] for chunk in map(chunker.add, [(0,) * 16] * max_frames) if chunk is not None]
    rest = chunker.flush().shape[1]
    return sizes + [rest] if rest else sizes


def one_by_one(streams: list[ExactCode2WavStream], codes: list[torch.Tensor]) -> list[torch.Tensor]:
    return [stream.decode(chunk) for stream, chunk in zip(streams, codes, strict=True)]


def run(decoder: Qwen3OmniMoeCode2Wav, decode: Decoder, schedule: list[int], starts: list[int],
        seed: int) -> list[float]:
    """Wall seconds of each round for fresh streams starting in rounds `starts`."""
    generator = torch.Generator().manual_seed(seed)
    codebook = decoder.config.codebook_size
    streams = [ExactCode2WavStream(decoder) for _ in starts]
    codes = [torch.randint(0, codebook, (16, sum(schedule)), generator=generator) for _ in starts]
    offsets = [0] * len(starts)
    times = []
    for round_ in range(max(starts) + len(schedule)):
        members = [i for i, start in enumerate(starts) if 0 <= round_ - start < len(schedule)]
        chunks = []
        for i in members:
            size = schedule[round_ - starts[i]]
            chunks.append(codes[i][:, offsets[i]:offsets[i] + size])
            offsets[i] += size
        began = time.perf_counter()
        decode([streams[i] for i in members], chunks)
        times.append(time.perf_counter() - began)
    return times


def first_second_rounds(schedule: list[int], starts: list[int]) -> int:
    """Rounds until every stream has decoded a second of audio."""
    frames = 0
    for count, size in enumerate(schedule, start=1):
        frames += size
        if frames * FRAME_S >= 1.0:
            return max(starts) + count
    return max(starts) + len(schedule)


def measure(decoder: Qwen3OmniMoeCode2Wav, schedule: list[int], streams: int, arrival: str, pairs: int) -> dict:
    starts = [0] * streams if arrival == "aligned" else [i % STAGGER_COHORTS for i in range(streams)]
    first = first_second_rounds(schedule, starts)
    runs: dict[str, list[list[float]]] = {"A": [], "B": []}
    run(decoder, decode_batch, schedule, starts, seed=-1)  # warm-up
    for pair in range(pairs):
        for label in "ABBA":
            decode = one_by_one if label == "A" else decode_batch
            runs[label].append(run(decoder, decode, schedule, starts, seed=pair))
    row = {"streams": streams, "arrival": arrival, "rounds": len(runs["A"][0]), "first_second_rounds": first}
    for label, name in (("A", "unbatched"), ("B", "batched")):
        row[f"{name}_round_ms"] = 1000 * statistics.median(statistics.fmean(t) for t in runs[label])
        row[f"{name}_first_second_ms"] = 1000 * statistics.median(sum(t[:first]) for t in runs[label])
    row["speedup_round"] = row["unbatched_round_ms"] / row["batched_round_ms"]
    row["speedup_first_second"] = row["unbatched_first_second_ms"] / row["batched_first_second_ms"]
    return row


def load_decoder(model: str, full_size: bool) -> Qwen3OmniMoeCode2Wav:
    if full_size:
        torch.manual_seed(0)
        return Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig()).eval()
    if not (Path(model) / "model.safetensors").is_file():
        from vllm_omni.models.qwen3_omni.tiny.checkpoint import build_tiny_checkpoint

        build_tiny_checkpoint(model)
    return load_checkpoint(model).code2wav


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / ".models/qwen3_omni_tiny"))
    parser.add_argument("--full-size", action="store_true", help="Qwen3-Omni's code2wav shape, random weights")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--arrivals", nargs="+", choices=("aligned", "staggered"), default=["aligned", "staggered"])
    parser.add_argument("--frames", type=int, default=88, help="frames per stream (88: the ramp up to 25)")
    parser.add_argument("--initial", type=int, default=1, help="first chunk's frames")
    parser.add_argument("--largest", type=int, default=25, help="largest chunk's frames")
    parser.add_argument("--pairs", type=int, default=2, help="ABBA repetitions")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/code2wav_batching.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    decoder = load_decoder(args.model, args.full_size)
    schedule = ramp_schedule(args.frames, args.initial, args.largest)
    print(f"schedule (frames per chunk): {schedule}; {args.threads} torch thread(s); "
          f"{'full-size random' if args.full_size else args.model} decoder", flush=True)
    rows = []
    header = (f"{'S':>3s} {'arrival':9s} {'rounds':>6s} {'A ms/round':>10s} {'B ms/round':>10s} {'x':>5s} "
              f"{'A first s (ms)':>14s} {'B first s (ms)':>14s} {'x':>5s}")
    print(header)
    for arrival in args.arrivals:
        for streams in args.streams:
            row = measure(decoder, schedule, streams, arrival, args.pairs)
            rows.append(row)
            print(f"{streams:3d} {arrival:9s} {row['rounds']:6d} {row['unbatched_round_ms']:10.2f} "
                  f"{row['batched_round_ms']:10.2f} {row['speedup_round']:5.2f} "
                  f"{row['unbatched_first_second_ms']:14.2f} {row['batched_first_second_ms']:14.2f} "
                  f"{row['speedup_first_second']:5.2f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"schedule": schedule, "threads": args.threads, "full_size": args.full_size,
                               "pairs": args.pairs, "order": "ABBA", "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
