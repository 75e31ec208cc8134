"""`vllm-omni serve MODEL --deploy-config PATH`: the realtime server, in the style of `vllm serve`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_omni.config import SessionDefaults
    from vllm_omni.session.base import NativeDuplexSettings


def register(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve a model over /v1/realtime and /v1/chat/completions")
    serve.add_argument("model", help="checkpoint folder or a model id in the local Hugging Face cache")
    serve.add_argument("--deploy-config", required=True, help="deploy YAML (see configs/)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                       help="require 'Authorization: Bearer KEY' on /v1 routes (default: $VLLM_API_KEY)")
    serve.add_argument("--served-model-name", action="append",
                       help="name(s) clients use for the model (default: MODEL)")
    serve.add_argument("--protect-metrics", action="store_true",
                       help="/metrics requires the API key too (default: open, like /health)")
    serve.add_argument("--max-session-duration-s", type=float, default=3600.0)
    serve.add_argument("--send-timeout-s", type=float,
                       help="drop a client that reads nothing for this long while events wait for it (default 30)")
    serve.add_argument("--max-history-audio-s", type=float,
                       help="user speech a conversation keeps; beyond it the oldest turns lose their audio "
                            "(default 1200)")
    serve.add_argument("--speaker", help="default voice (default: the model's own)")
    serve.add_argument("--max-request-body-bytes", type=int,
                       help="/v1/chat/completions: larger bodies get 413 (default 32 MiB)")
    serve.add_argument("--http-request-timeout-s", type=float,
                       help="/v1/chat/completions: an answer not done by then ends with a timeout error (default 600)")
    serve.add_argument("--answer-audio-ttl-s", type=float,
                       help="/v1/chat/completions: how long an answer's audio id can be referred to (default 3600)")
    serve.add_argument("--api-server-count", type=positive_int, default=1,
                       help="API frontend processes sharing --port, on one engine (default 1: all in one process)")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(run=serve_model)


def serve_model(args: argparse.Namespace) -> int:
    import uvicorn

    from vllm_omni.config import ConfigError, load_deploy_config
    from vllm_omni.engine.engine_host import refusal
    from vllm_omni.models.registry import load_engine
    from vllm_omni.server.app import create_app
    from vllm_omni.server.frontends import serve_frontends
    from vllm_omni.server.settings import UVICORN_OPTIONS, ServerSettings

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        deploy = load_deploy_config(args.deploy_config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = load_engine(args.model, deploy)
    limits = {"send_timeout_s": args.send_timeout_s, "max_history_audio_s": args.max_history_audio_s,
              "max_request_body_bytes": args.max_request_body_bytes,
              "http_request_timeout_s": args.http_request_timeout_s, "answer_audio_ttl_s": args.answer_audio_ttl_s}
    defaults = deploy.session_defaults
    settings = ServerSettings(
        served_model_names=args.served_model_name or [args.model], api_key=args.api_key,
        max_sessions=defaults.max_sessions, max_session_duration_s=args.max_session_duration_s,
        vad_model_path=defaults.server_vad_model_path, end_of_turn_model_path=defaults.end_of_turn_model_path,
        default_speaker=args.speaker,
        protect_metrics=args.protect_metrics, turn_detection_defaults=turn_detection_defaults(defaults),
        session_mode=deploy.session_mode, disconnect_grace_s=defaults.disconnect_grace_s,
        idle_ttl_s=defaults.idle_ttl_s, reaper_interval_s=defaults.reaper_interval_s,
        native_duplex=native_duplex_settings(defaults),
        **{name: value for name, value in limits.items() if value is not None})
    if args.api_server_count > 1:
        problem = refusal(engine)
        if problem is not None:
            engine.shutdown()
            print(f"error: {problem}", file=sys.stderr)
            return 2
        return serve_frontends(engine, settings, args.api_server_count, args.host, args.port, UVICORN_OPTIONS,
                               args.log_level)
    app = create_app(engine, settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, **UVICORN_OPTIONS)
    return 0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def native_duplex_settings(defaults: SessionDefaults) -> NativeDuplexSettings:
    from vllm_omni.session.base import NativeDuplexSettings

    return NativeDuplexSettings(allow_test_decisions=defaults.test_decisions,
                                continuation_limit_units=defaults.continuation_limit_units,
                                continuation_period_ms=defaults.continuation_period_ms)


def turn_detection_defaults(defaults: SessionDefaults) -> dict[str, float]:
    """The server-VAD fields a session gets when its client turns on `server_vad` without them."""
    return {"threshold": defaults.vad_threshold,
            "silence_duration_ms": float(defaults.vad_silence_duration_ms),
            "prefix_padding_ms": float(defaults.vad_prefix_padding_ms)}
