"""What a server is started with (the CLI builds it from flags and the deploy config)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_omni.protocol.session_config import TURN_DETECTION_DEFAULT_FIELDS
from vllm_omni.protocol.states import SessionMode
from vllm_omni.session.base import DEFAULT_MAX_HISTORY_AUDIO_S, NativeDuplexSettings, SessionOptions

# No per-message deflate: the traffic is mostly base64 audio, which compresses little, and
# compressing it cost the serving path more CPU than anything but code2wav under load.
UVICORN_OPTIONS = {"ws_max_size": 16 * 1024 * 1024, "ws_ping_interval": 20.0, "ws_ping_timeout": 20.0,
                   "ws_per_message_deflate": False}


@dataclass
class ServerSettings:
    served_model_names: list[str]
    api_key: str | None = None
    max_sessions: int = 64
    max_session_duration_s: float = 3600.0
    vad_model_path: str | None = None
    end_of_turn_model_path: str | None = None
    default_speaker: str | None = None  # None: the engine's `default_speaker`
    send_timeout_s: float = 30.0  # a client that takes no event for this long is dropped
    webrtc_connect_timeout_s: float = 20.0  # a WebRTC call not connected this long after its answer ends
    max_history_audio_s: float = DEFAULT_MAX_HISTORY_AUDIO_S  # user speech a conversation keeps
    protect_metrics: bool = False  # /metrics needs the API key too
    disconnect_grace_s: float = 30.0  # a detached duplex session waits this long for a resume
    idle_ttl_s: float | None = 300.0  # a duplex session without activity this long expires (None: never)
    reaper_interval_s: float = 5.0  # how often duplex leases are checked
    session_mode: str = "turn"  # the deploy's session_mode: which sessions /v1/realtime and /v1/duplex open
    # server-VAD values (threshold, silence_duration_ms, prefix_padding_ms) for clients that turn
    # server_vad on without them; what is missing keeps the built-in 0.5 / 500 / 300
    turn_detection_defaults: dict[str, float] = field(default_factory=dict)
    native_duplex: NativeDuplexSettings = field(default_factory=NativeDuplexSettings)
    # /v1/chat/completions
    max_request_body_bytes: int = 32 * 1024 * 1024  # larger bodies get 413
    http_request_timeout_s: float = 600.0  # an answer not finished by then ends with a timeout error
    answer_audio_ttl_s: float = 3600.0  # how long an answer's audio id can be referred to (its expires_at)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.turn_detection_defaults) - set(TURN_DETECTION_DEFAULT_FIELDS))
        if unknown:
            raise ValueError(f"turn_detection_defaults: unknown fields {', '.join(unknown)} "
                             f"(expected {', '.join(TURN_DETECTION_DEFAULT_FIELDS)})")
        SessionMode(self.session_mode)  # ValueError names a mode this server does not know

    def session_options(self) -> SessionOptions:
        return SessionOptions(served_models=list(self.served_model_names), session_mode=SessionMode(self.session_mode),
                              vad_model_path=self.vad_model_path, end_of_turn_model_path=self.end_of_turn_model_path,
                              default_speaker=self.default_speaker,
                              max_history_audio_s=self.max_history_audio_s, max_sessions=self.max_sessions,
                              turn_detection_defaults=dict(self.turn_detection_defaults),
                              native_duplex=self.native_duplex)
