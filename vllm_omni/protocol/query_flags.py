"""The boolean query parameters (`duplex`, `autostart`, `resume`): one vocabulary for all three
(docs/realtime-api.md §1.3). Any other value is a client error that ends the connection."""

from __future__ import annotations

from vllm_omni.protocol.errors import ProtocolError

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
FALSE_VALUES = frozenset({"0", "false", "no", "off"})


def query_flag(name: str, value: str | None) -> bool | None:
    """True or False as the client spelled it; None when the parameter is absent."""
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered in TRUE_VALUES:
        return True
    if lowered in FALSE_VALUES:
        return False
    raise ProtocolError("bad_event", f"query parameter {name} must be one of "
                        f"{', '.join(sorted(TRUE_VALUES | FALSE_VALUES))}, got {value[:50]!r}", name)
