"""Applying a `session.update`, one group of settings at a time (docs/realtime-api.md §2.2).

An update is split into independent groups (GROUPS); each is validated and applied on its own,
so one unsupported value rejects its group and the rest of the update still applies. Settings
that depend on each other share a group: the input rate and its format; turn detection, the
overlap policy and `extra_body.auto_response`. Only an update for another kind of session
(`session.type`) is refused whole. Precedence between spellings follows §2.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from vllm_omni.audio.formats import AudioFormat, check_rate
from vllm_omni.protocol.client_events import SessionSettings, field_problem, token_limit
from vllm_omni.protocol.errors import ProtocolError
from vllm_omni.protocol.session_config import SessionConfig, parse_format, parse_turn_detection

_UNSET = object()
Path = tuple[str, ...]
# extra_body keys that take effect through the turn-detection group (§2.5); not stored with the rest
TURN_EXTRA_KEYS = ("overlap_policy", "auto_response")
# The group a type error of a field no group names rejects: fields that are only validated (§2.3)
CHECKED_ONLY = "checked_only"

# The spellings of each setting, in precedence order (§2.1)
INPUT_FORMAT: tuple[Path, ...] = (("input_audio_format",), ("audio", "input", "format"))
INPUT_RATE: tuple[Path, ...] = (("sample_rate_hz",), ("sample_rate",), ("audio", "input", "sample_rate_hz"),
                                ("audio", "input", "sample_rate"))
OUTPUT_FORMAT: tuple[Path, ...] = (("output_audio_format",), ("response_format",), ("audio", "output", "format"))
OUTPUT_RATE_FIELDS: tuple[Path, ...] = (("audio", "output", "sample_rate_hz"), ("audio", "output", "sample_rate"))
TURN_DETECTION: tuple[Path, ...] = (("audio", "input", "turn_detection"), ("turn_detection",))
VOICE: tuple[Path, ...] = (("voice",), ("audio", "output", "voice"))
SPEED: tuple[Path, ...] = (("speed",), ("audio", "output", "speed"))
MODALITIES: tuple[Path, ...] = (("modalities",), ("output_modalities",))
TOKENS: tuple[Path, ...] = (("max_response_output_tokens",), ("max_output_tokens",), ("max_tokens",))
TRANSCRIPTION: tuple[Path, ...] = (("audio", "input", "transcription"), ("input_audio_transcription",))
NOISE_REDUCTION: tuple[Path, ...] = (("audio", "input", "noise_reduction"), ("input_audio_noise_reduction",))
PLAYBACK_POLICY: tuple[Path, ...] = (("extra_body", "playback_commit_policy"), ("playback_commit_policy",))
PLAYBACK_POLICIES = ("commit_all_on_done", "ack_only")
OVERLAP_SETTINGS = ("overlap_short_ack_ms", "overlap_barge_in_ms", "overlap_silence_rms")  # numbers >= 0 (§13.6)
STORED = ("include", "prompt", "tracing", "truncation")  # kept as sent, for the echo (§2.3)

Check = Callable[[Any], object]


@dataclass(frozen=True)
class SessionUpdateResult:
    """What one `session.update` did."""

    config: SessionConfig  # the effective configuration after it
    accepted: list[str]  # the groups it applied, by name (GROUPS)
    rejected: list[ProtocolError]  # one per problem, in the validation order of §2.2

    @property
    def updated(self) -> bool:
        """Whether `session.updated` follows the errors: the update was valid, or some group of it applied."""
        return bool(self.accepted) or not self.rejected


@dataclass(frozen=True)
class _Update:
    """One update being applied: what was sent, and to what."""

    session: dict[str, Any]
    current: SessionConfig
    served_models: list[str]
    mode: str
    vad_defaults: Mapping[str, float] | None

    def first(self, *paths: Path) -> Any:
        """The value at the first of `paths` the update has, else _UNSET."""
        for path in paths:
            value: Any = self.session
            for key in path:
                if not isinstance(value, dict) or key not in value:
                    break
                value = value[key]
            else:
                return value
        return _UNSET

    def extra(self) -> dict[str, Any]:
        extra = self.session.get("extra_body")
        return extra if isinstance(extra, dict) else {}


# The parser of a group: the SessionConfig fields it sets, None when the update does not touch
# it; raises ProtocolError to reject the group.
Parser = Callable[[_Update], dict[str, Any] | None]


def _session_type(u: _Update) -> None:
    if u.session.get("type") == "transcription":
        raise ProtocolError("bad_event", "transcription sessions are not supported", "session.type")


def _model(u: _Update) -> dict[str, Any] | None:
    model = u.first(("model",))
    if model is _UNSET:
        return None
    if model is not None and model not in u.served_models:
        raise ProtocolError("model_not_found", f"The model `{model}` does not exist.", "model")
    if model is not None and model != u.current.model:
        raise ProtocolError("model_update_unsupported", "model cannot change after the session opened", "model")
    return {}


def _input_format(u: _Update) -> dict[str, Any] | None:
    """The input format, and its rate: a rate sent alone changes the current format's."""
    fmt, rate = u.first(*INPUT_FORMAT), u.first(*INPUT_RATE)
    if fmt is _UNSET and rate is _UNSET:
        return None
    parsed = u.current.input_format if fmt is _UNSET else parse_format(fmt, output=False, param="audio.input.format")
    if rate is not _UNSET:
        try:
            checked = check_rate(rate)
        except ValueError as exc:
            raise ProtocolError("bad_event", str(exc), "sample_rate_hz") from None
        if checked is not None:
            parsed = AudioFormat(parsed.name, checked)
    return {"input_format": parsed}


def _output_format(u: _Update) -> dict[str, Any] | None:
    fmt = u.first(*OUTPUT_FORMAT)
    return None if fmt is _UNSET else {"output_format": parse_format(fmt, output=True, param="audio.output.format")}


def _turn_detection(u: _Update) -> dict[str, Any] | None:
    """Turn detection, then the overlap policy (§2.5), then `extra_body.auto_response`."""
    td = u.first(*TURN_DETECTION)
    extra = u.extra()
    policy = extra.get("overlap_policy", u.session.get("overlap_policy", _UNSET))
    if td is _UNSET and policy is _UNSET and extra.get("auto_response") is not True:
        return None
    updates: dict[str, Any] = {}
    if td is not _UNSET:
        updates["turn_detection"] = parse_turn_detection(td, u.mode, u.vad_defaults)
    if policy is not _UNSET:
        _apply_overlap_policy(policy, td, updates, u.current)
    if extra.get("auto_response") is True and u.mode != "native_duplex":  # natively duplex models hear all input
        raise ProtocolError("invalid_duplex_runtime_config",
                            "auto_response requires server VAD or explicit commits in turn mode", "extra_body")
    return updates


def _apply_overlap_policy(policy: Any, td_sent: Any, updates: dict[str, Any], current: SessionConfig) -> None:
    """overlap_policy decides interrupt_response when that is absent; a conflict is an error
    (docs/realtime-api.md §2.5)."""
    code, param = "unsupported_turn_detection", "turn_detection"
    wants_barge_in = policy == "barge_in_on_speech"
    effective = updates.get("turn_detection", current.turn_detection)
    if wants_barge_in and effective is None:
        raise ProtocolError(code, "overlap_policy=barge_in_on_speech requires turn_detection.type='server_vad'",
                            param)
    if effective is None:
        return
    sent_interrupt = isinstance(td_sent, dict) and "interrupt_response" in td_sent
    if sent_interrupt and td_sent["interrupt_response"] != wants_barge_in:
        expected = "barge_in_on_speech" if td_sent["interrupt_response"] else "listen_only"
        raise ProtocolError(code, f"overlap_policy={policy} conflicts with turn_detection; expected {expected}",
                            param)
    updates["turn_detection"] = effective.model_copy(update={"interrupt_response": wants_barge_in})


def _extra_body(u: _Update) -> dict[str, Any] | None:
    """Merged into the stored extra_body (never echoed), but for the turn-detection group's keys."""
    if "extra_body" not in u.session:
        return None
    if not isinstance(u.session["extra_body"], dict):
        raise ProtocolError("bad_event", "extra_body must be an object", "extra_body")
    own = {k: v for k, v in u.session["extra_body"].items() if k not in TURN_EXTRA_KEYS}
    return {"extra_body": {**u.current.extra_body, **own}} if own else None


def _modalities(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or any(m not in ("audio", "text") for m in value):
        raise ProtocolError("bad_event", "output_modalities must be a non-empty list of 'audio' and 'text'",
                            "output_modalities")
    return ["text", "audio"] if "audio" in value else ["text"]


def _voice(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError("bad_event", "voice must be a name (voice objects are not supported)",
                            "audio.output.voice")
    return value


def _playback_policy(value: Any) -> str:
    if value not in PLAYBACK_POLICIES:
        raise ProtocolError("bad_event", "playback_commit_policy must be commit_all_on_done or ack_only",
                            "playback_commit_policy")
    return value


def _overlap_setting(field: str) -> tuple[str, tuple[Path, ...], Parser]:
    """The group of one overlap threshold: `extra_body`'s value wins over the session key's (§2.1)."""
    paths: tuple[Path, ...] = (("extra_body", field), (field,))

    def parse(value: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ProtocolError("bad_event", f"{field} must be a number >= 0", field)
        return value
    return field, paths, _setting(field, paths, parse)


def _setting(field: str, paths: tuple[Path, ...], parse: Callable[[Any], Any] = lambda v: v) -> Parser:
    """The parser of a group of one setting: `field` set from the first of `paths` sent."""
    def parser(u: _Update) -> dict[str, Any] | None:
        value = u.first(*paths)
        return None if value is _UNSET else {field: parse(value)}
    return parser


def _flat(field: str) -> tuple[str, tuple[Path, ...], Parser]:
    """The group of one setting with one spelling, set as sent."""
    return field, ((field,),), _setting(field, ((field,),))


def _stored(u: _Update) -> dict[str, Any] | None:
    return {key: u.session[key] for key in STORED if key in u.session} or None


def _idle_timeout(u: _Update) -> dict[str, Any] | None:
    value = u.session.get("idle_timeout_s")
    return None if value is None else {"idle_timeout_s": float(value)}


# The groups in validation order (§2.2): name, the fields whose type errors reject it, parser.
GROUPS: list[tuple[str, tuple[Path, ...], Parser]] = [
    ("type", (("type",),), _session_type),
    ("model", (("model",),), _model),
    ("input_format", INPUT_FORMAT + INPUT_RATE, _input_format),
    ("output_format", OUTPUT_FORMAT + OUTPUT_RATE_FIELDS, _output_format),
    ("turn_detection", TURN_DETECTION + (("overlap_policy",),), _turn_detection),
    ("extra_body", (("extra_body",),), _extra_body),
    _flat("instructions"),
    ("modalities", MODALITIES, _setting("modalities", MODALITIES, _modalities)),
    ("voice", VOICE, _setting("voice", VOICE, _voice)),
    ("speed", SPEED, _setting("speed", SPEED)),
    ("max_output_tokens", TOKENS, _setting("max_output_tokens", TOKENS, token_limit)),
    _flat("temperature"),
    _flat("tools"),
    _flat("tool_choice"),
    _flat("metadata"),
    ("transcription", TRANSCRIPTION, _setting("transcription", TRANSCRIPTION)),
    ("noise_reduction", NOISE_REDUCTION, _setting("noise_reduction", NOISE_REDUCTION)),
    ("stored", tuple((key,) for key in STORED), _stored),
    ("idle_timeout_s", (("idle_timeout_s",),), _idle_timeout),
    ("playback_commit_policy", PLAYBACK_POLICY, _setting("playback_commit_policy", PLAYBACK_POLICY, _playback_policy)),
    *(_overlap_setting(field) for field in OVERLAP_SETTINGS),
    (CHECKED_ONLY, (), lambda u: None),
]


def _owners(loc: tuple[int | str, ...]) -> list[str]:
    """The groups a type error at `loc` rejects: those with a field at or inside `loc` (a wrong
    `audio.input` rejects every group spelled under it)."""
    owners = [name for name, paths, _ in GROUPS
              if any(loc[:len(path)] == path or path[:len(loc)] == loc for path in paths)]
    return owners or [CHECKED_ONLY]


def _type_errors(session: dict[str, Any]) -> list[ErrorDetails]:
    try:
        SessionSettings.model_validate(session)
    except ValidationError as exc:
        return exc.errors()
    return []


def apply_session_update(current: SessionConfig, session: dict[str, Any], served_models: list[str],
                         mode: str = "turn", vad_defaults: Mapping[str, float] | None = None,
                         checks: Mapping[str, Check] | None = None) -> SessionUpdateResult:
    """`session` (the update's `session` object) applied to `current`, group by group.

    A server_vad object gets the fields it leaves out from `vad_defaults`, else the built-in
    ones. `checks` are further validators by SessionConfig field (e.g. the engine's of tools,
    which this layer cannot import), run on the value a group would set; a ProtocolError one
    raises rejects that group."""
    checks = checks or {}
    rejected: dict[str, ProtocolError] = {}  # group -> the problem that rejected it, in the order found
    for error in _type_errors(session):  # types and bounds of every field first (§2.2)
        fresh = [name for name in _owners(error["loc"]) if name not in rejected]
        if fresh:
            rejected.update(dict.fromkeys(fresh, field_problem(error, "session.update")))
    update = _Update(session, current, served_models, mode, vad_defaults)
    updates: dict[str, Any] = {}
    accepted: list[str] = []
    for name, _, parse in GROUPS:
        if "type" in rejected:
            break  # an update for another kind of session: nothing of it applies
        if name in rejected:
            continue
        try:
            changes = parse(update)
            for field, value in (changes or {}).items():
                if field in checks:
                    checks[field](value)
        except ProtocolError as problem:
            rejected[name] = problem
            continue
        if changes is not None:
            updates.update(changes)
            accepted.append(name)
    return SessionUpdateResult(current.model_copy(update=updates), accepted, list(dict.fromkeys(rejected.values())))
