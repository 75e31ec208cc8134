"""`vllm-omni client --url URL --wav in.wav --out out.wav [--duplex [--native [--ref-audio voice.wav | --own-voice]]]
[--image PATH]`: speak a WAV file to a realtime server (GA lane, or the duplex lane of
docs/realtime-api.md §13; `--native` for a model that decides its own turns, §13.7), save the
spoken answers, print transcripts and timing. With `--chat [--text T] [--voice V]`, ask the same
over HTTP instead: streamed `POST /v1/chat/completions` with audio output, as OpenAI's SDK does,
each turn carrying the earlier questions and (by audio id) answers."""

from __future__ import annotations

import argparse
import asyncio
import sys

EXIT_BAD_INPUT, EXIT_FAILED = 2, 1


def register(commands: argparse._SubParsersAction) -> None:
    client = commands.add_parser("client", help="talk to a realtime server with a WAV file")
    client.add_argument("--url", required=True, help="server URL (http(s)://host:port or ws(s)://…/v1/realtime)")
    client.add_argument("--wav", required=True, help="question: 16 kHz mono 16-bit PCM WAV")
    client.add_argument("--out", required=True, help="where to write the answers' audio (WAV)")
    client.add_argument("--turns", type=int, default=1, help="speak the question this many times (default 1)")
    client.add_argument("--model", help="model name to ask for (default: the server's)")
    client.add_argument("--server-vad", action="store_true", help="let the server detect the end of speech")
    client.add_argument("--fast", action="store_true", help="send audio as fast as possible, not in real time")
    client.add_argument("--api-key", help="bearer token, if the server requires one")
    client.add_argument("--duplex", action="store_true", help="use the duplex lane (a session_mode: duplex server)")
    client.add_argument("--native", action="store_true",
                        help="with --duplex: a natively duplex model (MiniCPM-o, Moshi), which hears the WAV unit by "
                             "unit and decides itself when to speak")
    client.add_argument("--ref-audio", help="with --native: the voice to speak in (16 kHz mono 16-bit WAV); "
                                            "without it (or --own-voice) the answers are text only")
    client.add_argument("--own-voice", action="store_true",
                        help="with --native: speech in the model's own voice (Moshi), no --ref-audio")
    client.add_argument("--image", help="an image (PNG, JPEG) to show the model before the audio, as a user message")
    client.add_argument("--chat", action="store_true",
                        help="ask over HTTP: streamed POST /v1/chat/completions (OpenAI audio output)")
    client.add_argument("--text", help="with --chat: text sent with the spoken question")
    client.add_argument("--voice", help="with --chat: the voice to answer in (default Ethan)")
    client.add_argument("--max-tokens", type=int, help="with --chat: max_completion_tokens of each answer")
    client.set_defaults(run=run_client)


CHAT_ONLY = ("text", "voice", "max_tokens")
REALTIME_ONLY = ("server_vad", "duplex", "native", "ref_audio", "own_voice")


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    return [f"--{name.replace('_', '-')}" for name in names if getattr(args, name) not in (None, False)]


def format_turns(metrics: list[dict]) -> list[str]:
    """One line per turn: timing, and what a listener heard: playback stalls (how many, how
    long in all) and the least audio buffered ahead of the playhead (client/playback.py)."""
    def cell(value, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [f"{'turn':>4s} {'TTFT ms':>9s} {'TTFP ms':>9s} {'RTF':>7s} {'audio s':>8s} {'chunks':>6s} "
             f"{'stalls':>6s} {'stall ms':>8s} {'min buf ms':>10s}"]
    for number, m in enumerate(metrics, 1):
        lines.append(f"{number:4d} {cell(m['ttft_ms'], 1):>9s} {cell(m['ttfp_ms'], 1):>9s} {cell(m['rtf'], 3):>7s} "
                     f"{m['audio_duration_ms'] / 1000:8.2f} {m['chunk_count']:6d} {m['stall_count']:6d} "
                     f"{m['stall_ms']:8.1f} {cell(m['min_buffer_ms'], 1):>10s}")
    return lines


def report(metrics: list[dict], summary: dict, audio: bytes, rate: int, out: str) -> None:
    """The timing table, the means over turns with audio (`session_summary`), and the answers'
    audio written to `out`."""
    from vllm_omni.client.wav import write_pcm16

    print()
    print("\n".join(format_turns(metrics)))
    print(f"\nmean over {summary['audio_turn_count']} turns with audio: TTFT {summary['mean_ttft_ms']} ms, "
          f"TTFP {summary['mean_ttfp_ms']} ms, RTF {summary['mean_rtf']}")
    write_pcm16(out, audio, rate)
    print(f"wrote {out} ({len(audio) / (2 * rate):.2f} s at {rate} Hz)")


def run_client(args: argparse.Namespace) -> int:
    from vllm_omni.client.images import image_data_url
    from vllm_omni.client.turns import run_session
    from vllm_omni.client.url import realtime_url
    from vllm_omni.client.wav import WavError, read_pcm16

    if args.chat:
        return run_chat_client(args)
    if _given(args, CHAT_ONLY):
        print(f"error: {', '.join(_given(args, CHAT_ONLY))}: only with --chat", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.native or args.ref_audio or args.own_voice:
        return run_native_client(args)
    try:
        url = realtime_url(args.url, model=args.model)
        pcm = read_pcm16(args.wav)
        if args.image is not None:
            image_data_url(args.image)  # a bad path fails here, before connecting
        if args.turns < 1:
            raise ValueError(f"--turns must be at least 1, got {args.turns}")
    except (WavError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    try:
        result = asyncio.run(run_session(url, pcm, turns=args.turns, model=args.model, server_vad=args.server_vad,
                                         realtime=not args.fast, headers=headers, duplex=args.duplex,
                                         image=args.image))
    except Exception as exc:  # unreachable, refused handshake, closed socket, timeout: one line, no traceback
        print(f"error: {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if result.image_error is not None:
        refusal = result.image_error.get("error") or {}
        print(f"server refused the image ({refusal.get('code')}: {refusal.get('message')}); "
              "went on without it", file=sys.stderr)
    for number, transcript in enumerate(result.transcripts, 1):
        print(f"turn {number}: {transcript.strip()}")
    for error in result.errors:
        print(f"server error: {error.get('error', error)}", file=sys.stderr)
    rate = next((t.response.sample_rate for t in result.turns if t.response is not None), 24000)
    report([t.metrics for t in result.turns], result.summary, result.audio, rate, args.out)
    return 0 if not result.errors and all(t.response and t.response.status == "completed" for t in result.turns) \
        else EXIT_FAILED


def run_chat_client(args: argparse.Namespace) -> int:
    from vllm_omni.client.chat import DEFAULT_VOICE, OUTPUT_RATE, run_chat
    from vllm_omni.client.images import image_data_url
    from vllm_omni.client.timing import session_summary
    from vllm_omni.client.url import chat_base_url
    from vllm_omni.client.wav import WavError, read_pcm16

    try:
        if _given(args, REALTIME_ONLY):
            raise ValueError(f"{', '.join(_given(args, REALTIME_ONLY))}: realtime only, not with --chat")
        if args.turns < 1:
            raise ValueError(f"--turns must be at least 1, got {args.turns}")
        if args.max_tokens is not None and args.max_tokens < 1:
            raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
        base = chat_base_url(args.url)
        pcm = read_pcm16(args.wav)
        image = image_data_url(args.image) if args.image is not None else None
    except (WavError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        answers = asyncio.run(run_chat(base, pcm, turns=args.turns, text=args.text, image_url=image,
                                       model=args.model, voice=args.voice or DEFAULT_VOICE, api_key=args.api_key,
                                       max_tokens=args.max_tokens))
    except Exception as exc:  # unreachable, HTTP error status, broken stream: one line, no traceback
        print(f"error: {base}: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_FAILED
    for number, answer in enumerate(answers, 1):
        print(f"turn {number}: {answer.transcript.strip()}")
    metrics = [answer.metrics for answer in answers]
    report(metrics, session_summary(metrics), b"".join(answer.pcm for answer in answers), OUTPUT_RATE, args.out)
    unfinished = [number for number, answer in enumerate(answers, 1) if answer.finish_reason is None]
    if unfinished:
        print(f"error: turns {unfinished}: the stream ended without a finish_reason", file=sys.stderr)
    return EXIT_FAILED if unfinished else 0


def run_native_client(args: argparse.Namespace) -> int:
    from vllm_omni.client.native_duplex import native_opening, run_native_session
    from vllm_omni.client.url import realtime_url
    from vllm_omni.client.wav import WavError, read_pcm16, wav_data_url, write_pcm16

    try:
        if not (args.native and args.duplex):
            raise ValueError("--native (and --ref-audio, --own-voice) need --duplex: native sessions live on the "
                             "duplex lane")
        if args.image is not None or args.turns != 1 or args.server_vad:
            raise ValueError("--native takes one clip: no --image, --turns or --server-vad")
        url = realtime_url(args.url)
        pcm = read_pcm16(args.wav)
        voice = wav_data_url(args.ref_audio) if args.ref_audio else None
    except (WavError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    opening = native_opening(model=args.model, ref_audio=voice, own_voice=args.own_voice)
    try:
        result = asyncio.run(run_native_session(url, pcm, opening=opening,
                                                realtime=not args.fast, headers=headers))
    except Exception as exc:
        print(f"error: {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print("units: " + "".join("S" if d == "speak" else "." for d in result.decisions) + "  (S: spoke, .: listened)")
    for number, record in enumerate(result.responses, 1):
        print(f"response {number} ({record.status}): {record.transcript.strip()}")
    for error in result.errors:
        print(f"server error: {error.get('error', error)}", file=sys.stderr)
    lag, ttfp = result.summary["decision_lag_ms"], result.summary["ttfp_ms"]
    print(f"\ndecision lag ms: p50 {lag['p50']} p95 {lag['p95']}; TTFP ms: p50 {ttfp['p50']} p95 {ttfp['p95']}")
    rate = next((r.sample_rate for r in result.responses), 24000)
    write_pcm16(args.out, result.audio, rate)
    print(f"wrote {args.out} ({len(result.audio) / (2 * rate):.2f} s at {rate} Hz)")
    return 0 if not result.errors else EXIT_FAILED
