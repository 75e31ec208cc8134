"""Protocol error codes, their GA error classes, and the exception that carries them."""

from __future__ import annotations

RATE_LIMIT_CODES = {"input_backpressure", "resource_exhausted"}
SERVER_CODES = {"commit_aborted", "realtime_input_failed", "engine_error", "internal_error", "stage_unavailable",
                "runtime_data_plane_stream_failed", "server_vad_unavailable"}


def error_class(code: str) -> str:
    if code in RATE_LIMIT_CODES:
        return "rate_limit_error"
    if code in SERVER_CODES:
        return "server_error"
    return "invalid_request_error"


class ProtocolError(Exception):
    """A client event that cannot be applied; becomes one `error` event, the session goes on
    (unless `fatal`). `event_id`: the client's id of the event, when the error is raised where
    the event was not parsed yet (its error echoes it, docs/realtime-api.md §4.0)."""

    def __init__(self, code: str, message: str, param: str | None = None, fatal: bool = False,
                 event_id: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param, self.fatal = code, message, param, fatal
        self.event_id = event_id
