"""`session.capabilities` (docs/realtime-api.md §2.6): what a session kind and its model can do,
one column per kind. Clients branch on these flags, not on the model name, so every kind sends
every key."""

from __future__ import annotations

from typing import Any, Literal

Kind = Literal["turn", "turn_based_duplex", "model_native_duplex"]

# The turn-based column (Qwen3-Omni, turn mode and the duplex lane alike)
TURN_BASED: dict[str, Any] = {
    "implementation_level": "turn_based_duplex", "chunk_period_ms": 1000,
    "supports_model_native_turn_policy": False, "supports_barge_in": True, "supports_input_append": True,
    "supports_session_resume": True, "supports_session_lease": True, "supports_audio_truncate": True,
    "supports_image_input": True, "supports_text_only_turn": True, "supports_core_resumable_request": False,
    "required_input_modalities": ["audio"], "optional_input_modalities": ["video"],
    "session_admission_mode": "engine_managed", "input_modes": ["append_audio_chunk"],
    "adapter_patterns": ["turn_commit"], "signal_sources": ["client_event", "server_policy"],
    "stage_handoff_transport": "scheduler_data_plane", "target_barge_in_latency_ms": None,
    "supports_session_adapter": True, "supports_external_turn_signal": True, "supports_client_commit": True,
    "supports_playback_ack": True, "supports_replace_latest_chunk": False, "supports_reencode_context": True,
    "supports_rollback_to_checkpoint": False, "supports_turn_commit_only": True, "supports_kv_lease": False,
    "supports_core_kv_lease": False, "supports_model_internal_state": False, "supports_stage_resumption": False,
    "supports_scheduler_native_append": False, "supports_concurrent_turn_requests": False,
    "supports_stage_connector_handoff": False, "supports_independent_io_streams": True,
    "supports_realtime_endpoint": True, "requires_model_runner_kv": False, "requires_native_stage_role": False,
}

COLUMNS: dict[Kind, dict[str, Any]] = {
    "turn_based_duplex": TURN_BASED,
    # turn mode: no resume or lease (a session ends with its socket)
    "turn": {**TURN_BASED, "supports_session_resume": False, "supports_session_lease": False},
    "model_native_duplex": {
        **TURN_BASED, "implementation_level": "model_native_duplex", "supports_model_native_turn_policy": True,
        "supports_image_input": False, "supports_text_only_turn": False, "supports_core_resumable_request": True,
        "adapter_patterns": ["scheduler_data_plane"],
        "signal_sources": ["model_native", "client_event", "server_policy"],
        "supports_reencode_context": False, "supports_turn_commit_only": False,
        "supports_model_internal_state": True, "supports_stage_resumption": True,
        "supports_stage_connector_handoff": True, "requires_model_runner_kv": True,
        "requires_native_stage_role": True,
    },
}


def capabilities(kind: Kind, *, max_sessions: int, image_input: bool | None = None) -> dict[str, Any]:
    """The `kind` column; `image_input` (a turn-based model's: whether its deploy lets the thinker
    take images) overrides the column's `supports_image_input`."""
    column = {**COLUMNS[kind], "supports_multi_session": max_sessions > 1,
              "supports_multi_session_same_replica": max_sessions > 1}
    if image_input is not None:
        column["supports_image_input"] = image_input
    return column
