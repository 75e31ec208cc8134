"""The realtime endpoint's URL, and the HTTP base of the OpenAI SDK, from whatever base a user types."""

from __future__ import annotations

from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from vllm_omni.protocol.ga_view import EXTENSIONS_QUERY, VLLM_OMNI, wants_extensions

SCHEMES = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
HTTP_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
REALTIME_PATH = "/v1/realtime"
CALLS_PATH = "/realtime/calls"  # under the API's /v1


def _split(base: str) -> SplitResult:
    parts = urlsplit(base.strip())
    if parts.scheme not in SCHEMES:
        raise ValueError(f"unsupported URL scheme {parts.scheme or '(none)'!r} in {base!r}: "
                         "use http, https, ws or wss")
    if not parts.netloc:
        raise ValueError(f"no host in {base!r}")
    return parts


def _flag(value: bool) -> str:
    return "1" if value else "0"


def realtime_url(base: str, *, model: str | None = None, duplex: bool | None = None,
                 native_duplex: bool | None = None, autostart: bool | None = None,
                 session_id: str | None = None) -> str:
    """`http(s)://host:port[/path]` or `ws(s)://…` → the `ws(s)://…/v1/realtime?…` URL.

    A base without a path gets `/v1/realtime`; query parameters that are None are left out
    (`native_duplex` and `session_id` are obsolete on the server, which ignores them, but old
    clients send them)."""
    parts = _split(base)
    path = parts.path if parts.path not in ("", "/") else REALTIME_PATH
    query = {key: value for key, value in (
        ("model", model),
        ("duplex", None if duplex is None else _flag(duplex)),
        ("native_duplex", None if native_duplex is None else _flag(native_duplex)),
        ("autostart", None if autostart is None else _flag(autostart)),
        ("session_id", session_id)) if value is not None}
    existing = parts.query + ("&" if parts.query and query else "")
    return urlunsplit((SCHEMES[parts.scheme], parts.netloc, path, existing + urlencode(query), ""))


def chat_base_url(base: str) -> str:
    """`http(s)://host:port[/path]` or `ws(s)://…` → the `http(s)://…/v1` base the OpenAI SDK
    wants: the path up to its first `v1` segment (`/v1/realtime` → `/v1`), else the path with
    `/v1` appended (behind a proxy, `/omni` → `/omni/v1`); query and fragment dropped."""
    parts = _split(base)
    segments = [segment for segment in parts.path.split("/") if segment]
    segments = segments[:segments.index("v1") + 1] if "v1" in segments else [*segments, "v1"]
    return urlunsplit((HTTP_SCHEMES[parts.scheme], parts.netloc, "/" + "/".join(segments), "", ""))


def calls_url(base: str) -> str:
    """`http(s)://host:port[/path]` or `ws(s)://…` → the `http(s)://…/v1/realtime/calls` URL a
    WebRTC call is posted to (the path up to its first `v1` segment, as `chat_base_url`)."""
    return chat_base_url(base) + CALLS_PATH


def with_query(url: str, **params: str) -> str:
    """`url` with these query parameters set (replacing any of the same names)."""
    parts = urlsplit(url)
    kept = [(key, value) for key, value in parse_qsl(parts.query, keep_blank_values=True) if key not in params]
    return urlunsplit(parts._replace(query=urlencode(kept + list(params.items()))))


def with_extensions(url: str) -> str:
    """`url` asking the server for its extension events and fields (docs/realtime-api.md §1.3);
    unchanged if it already does."""
    if wants_extensions(dict(parse_qsl(urlsplit(url).query)).get(EXTENSIONS_QUERY)):
        return url
    return with_query(url, **{EXTENSIONS_QUERY: VLLM_OMNI})
