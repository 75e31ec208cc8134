"""`vllm-omni bench realtime`: our server and a transformers baseline under the same load, over the
realtime WebSocket or (`--endpoint chat`) streamed HTTP chat completions; `bench native`,
`bench turn-detection`, and `bench capacity` (the most concurrent sessions within a target)."""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

EXIT_BAD_INPUT = 2


def register(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmarks")
    kinds = bench.add_subparsers(dest="kind", metavar="KIND", required=True)
    realtime = kinds.add_parser("realtime", help="concurrent realtime sessions, ours against a baseline")
    realtime.add_argument("--url", required=True, help="the server to measure (http(s)://host:port or ws(s)://…)")
    realtime.add_argument("--sessions", default="1,4,8", help="concurrency levels, comma-separated (default 1,4,8)")
    realtime.add_argument("--turns", type=int, default=3, help="turns per session (default 3)")
    realtime.add_argument("--wav", required=True, help="the spoken question: 16 kHz mono 16-bit PCM WAV")
    realtime.add_argument("--out-dir", required=True, help="where results.json and the plot go")
    realtime.add_argument("--model", help="model name to ask for (default: the server's)")
    realtime.add_argument("--endpoint", choices=ENDPOINTS, default="realtime",
                          help="realtime: WebSocket sessions (default); chat: each session a conversation of "
                               "streamed POST /v1/chat/completions requests (OpenAI audio output)")
    realtime.add_argument("--arrival-spread-s", type=float, default=0.0,
                          help="start the sessions evenly over this many seconds (default 0: all at once, the worst "
                               "case; about the question's length is closer to real callers)")
    realtime.add_argument("--server-vad", action="store_true", help="server-side turn detection instead of commits")
    realtime.add_argument("--transport", default="websocket",
                          help="how --url's sessions connect, comma-separated: websocket (default), webrtc (calls "
                               "to /v1/realtime/calls, server VAD, timed at the receiving track), or both "
                               "(targets vllm-omni and vllm-omni/webrtc)")
    realtime.add_argument("--duplex", action="store_true",
                          help="drive --url's sessions over the duplex lane (a session_mode: duplex server)")
    realtime.add_argument("--barge-in", action="store_true",
                          help="duplex lane, server VAD: speak over every answer and time how soon the server "
                               "stops it (implies --duplex)")
    realtime.add_argument("--barge-in-wav", help="the interrupting speech (16 kHz mono 16-bit WAV; default: --wav)")
    realtime.add_argument("--compare-transcription", action="store_true",
                          help="also measure --url with input transcription on (target vllm-omni+transcribe)")
    baseline = realtime.add_mutually_exclusive_group(required=True)
    baseline.add_argument("--baseline-model", help="checkpoint for a transformers baseline started in this process")
    baseline.add_argument("--baseline-url", help="a baseline server already running")
    baseline.add_argument("--no-baseline", action="store_true", help="measure only --url")
    realtime.add_argument("--baseline-thinker-tokens", type=int, default=64)
    realtime.add_argument("--baseline-talker-tokens", type=int, default=256)
    realtime.set_defaults(run=run_realtime_bench)
    native = kinds.add_parser("native", help="concurrent natively duplex sessions (MiniCPM-o, Moshi): decision lag, "
                                             "TTFP")
    native.add_argument("--url", required=True, help="a natively duplex server (http(s)://host:port or ws(s)://…)")
    native.add_argument("--wav", required=True, help="the clip every session streams: 16 kHz mono 16-bit PCM WAV")
    native.add_argument("--ref-audio", help="the voice to speak in (16 kHz mono 16-bit WAV); without it (or "
                                            "--own-voice), text only")
    native.add_argument("--own-voice", action="store_true", help="speech in the model's own voice (Moshi)")
    native.add_argument("--sessions", default="1,4", help="concurrency levels, comma-separated (default 1,4)")
    native.add_argument("--model", help="model name to ask for (default: the server's)")
    native.add_argument("--out-dir", required=True, help="where native.json and the plot go")
    native.set_defaults(run=run_native_bench)
    turns = kinds.add_parser("turn-detection", help="how soon each turn-detection setting ends the same turns")
    turns.add_argument("--url", required=True, help="the server to measure (http(s)://host:port or ws(s)://…)")
    turns.add_argument("--wav", action="append", required=True,
                       help="a recording (16 kHz mono 16-bit PCM WAV); repeat for several")
    turns.add_argument("--settings", default=",".join(DEFAULT_TURN_SETTINGS),
                       help="comma-separated: server_vad, semantic_vad:<low|medium|high|auto> (default: all four)")
    turns.add_argument("--trailing-silence-s", type=float, default=3.0,
                       help="silence streamed after each recording (default 3)")
    turns.add_argument("--out-dir", required=True, help="where turn_detection.json and the plot go")
    turns.set_defaults(run=run_turn_detection_bench)
    capacity = kinds.add_parser("capacity", help="the most concurrent sessions served within a service target")
    capacity.add_argument("--url", required=True, help="the server to measure (http(s)://host:port or ws(s)://…)")
    capacity.add_argument("--wav", required=True, help="the spoken question: 16 kHz mono 16-bit PCM WAV")
    capacity.add_argument("--out-dir", required=True, help="where capacity.json and the plot go")
    capacity.add_argument("--model", help="model name to ask for (default: the server's)")
    capacity.add_argument("--endpoint", choices=ENDPOINTS, default="realtime",
                          help="realtime: WebSocket sessions (default); chat: streamed POST /v1/chat/completions")
    capacity.add_argument("--turns", type=int, default=3, help="turns per session (default 3)")
    capacity.add_argument("--start", type=int, default=1,
                          help="the first level after one session; levels double from it (default 1)")
    capacity.add_argument("--max-sessions", type=int, default=64, help="the largest level tried (default 64)")
    capacity.add_argument("--arrival-spread-s", type=float,
                          help="start a level's sessions evenly over this many seconds (default: the question's "
                               "length)")
    capacity.add_argument("--max-rtf-p95", type=float, default=1.0,
                          help="a level passes with RTF p95 under this (default 1.0)")
    capacity.add_argument("--max-playable-start-ratio", type=float, default=2.0,
                          help="and playable-start p95 at most this times one session's (default 2.0)")
    capacity.set_defaults(run=run_capacity_bench)


ENDPOINTS = ("realtime", "chat")
REALTIME_ONLY = ("server_vad", "duplex", "barge_in", "barge_in_wav", "compare_transcription")
TRANSCRIBED_TARGET = "vllm-omni+transcribe"
WEBRTC_TARGET = "vllm-omni/webrtc"
TRANSPORTS = ("websocket", "webrtc")
DEFAULT_TURN_SETTINGS = ("server_vad", "semantic_vad:high", "semantic_vad:medium", "semantic_vad:low")


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sessions: expected numbers like 1,4,8, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ValueError(f"--sessions: expected positive numbers, got {text!r}")
    return levels


def _transports(args: argparse.Namespace) -> list[str]:
    """The --transport list, checked: WebRTC calls are GA realtime sessions with server VAD."""
    chosen = [part.strip() for part in args.transport.split(",") if part.strip()]
    unknown = sorted(set(chosen) - set(TRANSPORTS))
    if not chosen or unknown:
        raise ValueError(f"--transport: expected websocket, webrtc or both, got {args.transport!r}")
    if "webrtc" in chosen and (args.endpoint == "chat" or args.duplex or args.barge_in):
        raise ValueError("--transport webrtc: the realtime endpoint's GA lane only (no --endpoint chat, --duplex "
                         "or --barge-in)")
    return chosen


def _check_endpoint(args: argparse.Namespace) -> None:
    """The chat endpoint has no turn detection, duplex lane or input transcription."""
    given = [f"--{name.replace('_', '-')}" for name in REALTIME_ONLY if getattr(args, name)]
    if args.endpoint == "chat" and given:
        raise ValueError(f"{', '.join(given)}: realtime endpoint only, not with --endpoint chat")


def run_realtime_bench(args: argparse.Namespace) -> int:
    from vllm_omni.bench import chat
    from vllm_omni.bench.realtime import format_table, run_benchmark, write_results
    from vllm_omni.client.url import calls_url, chat_base_url, realtime_url
    from vllm_omni.client.wav import WavError, read_pcm16

    over_chat = args.endpoint == "chat"
    address = chat_base_url if over_chat else realtime_url
    try:
        _check_endpoint(args)
        levels = _levels(args.sessions)
        pcm = read_pcm16(args.wav)
        interruption = read_pcm16(args.barge_in_wav or args.wav) if args.barge_in else None
        transports = _transports(args)
        targets = {}
        if "websocket" in transports:
            targets["vllm-omni"] = chat_base_url(args.url) if over_chat else realtime_url(args.url, model=args.model)
        if "webrtc" in transports:
            targets[WEBRTC_TARGET] = calls_url(args.url)
        transcribed = {TRANSCRIBED_TARGET} if args.compare_transcription else set()
        if transcribed and "websocket" not in transports:
            raise ValueError("--compare-transcription: measures a WebSocket target (add websocket to --transport)")
        if transcribed:
            targets[TRANSCRIBED_TARGET] = targets["vllm-omni"]
        duplex = set(targets) if args.duplex or args.barge_in else set()  # the --url targets, not the baseline
        if args.baseline_url:
            targets["baseline"] = address(args.baseline_url)
        if args.baseline_model and not Path(args.baseline_model).is_dir():
            raise ValueError(f"--baseline-model: no checkpoint folder at {args.baseline_model}")
        if args.turns < 1:
            raise ValueError(f"--turns must be at least 1, got {args.turns}")
        if args.arrival_spread_s < 0:
            raise ValueError(f"--arrival-spread-s must be 0 or more, got {args.arrival_spread_s}")
    except (WavError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    with ExitStack() as stack:
        if args.baseline_model:
            from vllm_omni.bench.baseline_server import BaselineSettings, running_baseline

            settings = BaselineSettings(args.baseline_thinker_tokens, args.baseline_talker_tokens)
            targets["baseline"] = address(stack.enter_context(running_baseline(args.baseline_model, settings)))
        if over_chat:
            results = chat.run_benchmark(targets, levels, pcm, args.turns, model=args.model,
                                         arrival_spread_s=args.arrival_spread_s)
        else:
            results = run_benchmark(targets, levels, pcm, args.turns, model=args.model, server_vad=args.server_vad,
                                    transcribed=transcribed, duplex=duplex, interruption=interruption,
                                    arrival_spread_s=args.arrival_spread_s, webrtc={WEBRTC_TARGET} & set(targets))
    settings = {"endpoint": args.endpoint, "transports": transports, "targets": targets, "levels": levels,
                "turns": args.turns,
                "wav": args.wav, "server_vad": args.server_vad or args.barge_in,
                "transcribed_targets": sorted(transcribed), "duplex_targets": sorted(duplex),
                "barge_in_wav": (args.barge_in_wav or args.wav) if args.barge_in else None,
                "paced": "whole question per request" if over_chat else "real time",
                "arrival_spread_s": args.arrival_spread_s,
                "baseline": {"model": args.baseline_model, "thinker_max_new_tokens": args.baseline_thinker_tokens,
                             "talker_max_new_tokens": args.baseline_talker_tokens}}
    written = write_results(results, settings, Path(args.out_dir))
    print(format_table(results))
    for path in written:
        print(f"wrote {path}")
    failures = [f for rows in results.values() for row in rows for f in row["failures"]]
    for failure in failures:
        print(f"session failed: {failure}", file=sys.stderr)
    return 0


def run_native_bench(args: argparse.Namespace) -> int:
    from vllm_omni.bench.native import format_table, run_benchmark, write_results
    from vllm_omni.client.native_duplex import native_opening
    from vllm_omni.client.url import realtime_url
    from vllm_omni.client.wav import WavError, read_pcm16, wav_data_url

    try:
        levels = _levels(args.sessions)
        pcm = read_pcm16(args.wav)
        opening = native_opening(model=args.model, ref_audio=wav_data_url(args.ref_audio) if args.ref_audio else None,
                                 own_voice=args.own_voice)
    except (WavError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    url = realtime_url(args.url)
    rows = run_benchmark(url, levels, pcm, opening)
    print(format_table(rows))
    written = write_results(rows, {"url": url, "wav": args.wav, "ref_audio": args.ref_audio, "levels": levels,
                                   "paced": "real time"}, Path(args.out_dir))
    for path in written:
        print(f"wrote {path}")
    for failure in (f for row in rows for f in row["failures"]):
        print(f"session failed: {failure}", file=sys.stderr)
    return 0


def run_turn_detection_bench(args: argparse.Namespace) -> int:
    from vllm_omni.bench.turn_detection import Recording, format_table, run_benchmark, turn_detection, write_results
    from vllm_omni.client.url import realtime_url
    from vllm_omni.client.wav import WavError, read_pcm16

    try:
        settings = [part.strip() for part in args.settings.split(",") if part.strip()]
        for setting in settings:
            turn_detection(setting)
        recordings = [Recording(Path(path).name, read_pcm16(path)) for path in args.wav]
        if args.trailing_silence_s < 0:
            raise ValueError(f"--trailing-silence-s must not be negative, got {args.trailing_silence_s}")
    except (WavError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    url = realtime_url(args.url)
    rows = run_benchmark(url, settings, recordings, args.trailing_silence_s)
    print(format_table(rows))
    written = write_results(rows, {"url": url, "wavs": args.wav, "settings": settings,
                                   "trailing_silence_s": args.trailing_silence_s, "paced": "real time"},
                            Path(args.out_dir))
    for path in written:
        print(f"wrote {path}")
    return 0


def run_capacity_bench(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from vllm_omni.bench import chat, realtime
    from vllm_omni.bench.capacity import Target, capacity_line, format_table, search_capacity, write_results
    from vllm_omni.bench.report import run_levels
    from vllm_omni.client.timing import pcm16_ms
    from vllm_omni.client.url import chat_base_url, realtime_url
    from vllm_omni.client.wav import WavError, read_pcm16

    try:
        pcm = read_pcm16(args.wav)
        spread_s = pcm16_ms(len(pcm), 16000) / 1000 if args.arrival_spread_s is None else args.arrival_spread_s
        if args.turns < 1 or args.start < 1 or args.max_sessions < args.start or spread_s < 0:
            raise ValueError(f"need --turns ≥ 1, 1 ≤ --start ≤ --max-sessions and --arrival-spread-s ≥ 0 (got "
                             f"{args.turns}, {args.start}, {args.max_sessions}, {spread_s})")
        if args.max_rtf_p95 <= 0 or args.max_playable_start_ratio < 1:
            raise ValueError(f"need --max-rtf-p95 > 0 and --max-playable-start-ratio ≥ 1 (got {args.max_rtf_p95}, "
                             f"{args.max_playable_start_ratio})")
    except (WavError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    over_chat = args.endpoint == "chat"
    url = chat_base_url(args.url) if over_chat else realtime_url(args.url, model=args.model)
    level = realtime.level_runner(chat.run_level if over_chat else realtime.run_level, url, pcm, args.turns,
                                  model=args.model, arrival_spread_s=spread_s)
    target = Target(args.max_rtf_p95, args.max_playable_start_ratio)
    rows, capacity = search_capacity(lambda n: run_levels("capacity", [n], level, answers_per_session=args.turns)[0],
                                     target, start=args.start, max_sessions=args.max_sessions)
    settings = {"endpoint": args.endpoint, "url": url, "wav": args.wav, "turns": args.turns, "start": args.start,
                "max_sessions": args.max_sessions, "arrival_spread_s": spread_s,
                "paced": "whole question per request" if over_chat else "real time",
                "target": {**asdict(target), "failed_sessions": 0, "error_events": 0, "lost_audio_turns": 0,
                           "every_turn_completed": True}}
    written = write_results(rows, capacity, target, settings, Path(args.out_dir))
    print(format_table(rows))
    for path in written:
        print(f"wrote {path}")
    for failure in (f for row in rows for f in row["failures"]):
        print(f"session failed: {failure}", file=sys.stderr)
    print(capacity_line(capacity, rows, args.max_sessions))
    return 0
