"""Stop strings: text that ends the answer where it first appears.

The talker speaks every text token routed to it, so a stop string must be caught before its
tokens leave the text stage's router, not cut from the text afterwards. `StopStrings` holds
each token back while its text could still be part of a stop string, and releases tokens in
order once it cannot; when a stop string appears, the tokens before it are released and the
answer ends there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from vllm_omni.engine.request import RequestError

MAX_STOP_STRINGS = 4  # as OpenAI's chat completions allow

Item = TypeVar("Item")


def checked_stop_strings(stop: object) -> tuple[str, ...]:
    """`OmniRequest.stop` validated: at most MAX_STOP_STRINGS non-empty strings."""
    if not isinstance(stop, tuple | list) or len(stop) > MAX_STOP_STRINGS or \
            not all(isinstance(s, str) and s for s in stop):
        raise RequestError(f"stop: expected a list of at most {MAX_STOP_STRINGS} non-empty strings, got {stop!r}")
    return tuple(stop)


@dataclass
class Released(Generic[Item]):
    """What one step of `StopStrings` lets go: items to route, in order, and the answer text
    they add with its token ids. When a stop string cut a token, the text before the stop
    and that token's ids are included, but the token is not among `items`: it is never routed."""

    items: list[Item] = field(default_factory=list)
    text: str = ""
    token_ids: tuple[int, ...] = ()
    stopped: bool = False  # a stop string appeared: the answer ends with this text


@dataclass
class _Held(Generic[Item]):
    text: str
    token_ids: tuple[int, ...]
    item: Item


class StopStrings(Generic[Item]):
    """Holds the text stage's answer tokens, one (text delta, token ids, item) at a time, until
    no stop string can include them. An item without text (a partial character, an event that
    is not answer text) waits for the text after it, so it leaves together with what follows."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""  # answer text released so far
        self.token_ids: list[int] = []  # its tokens
        self._held: list[_Held[Item]] = []

    def add(self, text: str, token_ids: tuple[int, ...], item: Item) -> Released[Item]:
        self._held.append(_Held(text, token_ids, item))
        held = "".join(h.text for h in self._held)  # any stop string found starts in here
        at = min((i for i in (held.find(s) for s in self.stops) if i >= 0), default=-1)
        if at >= 0:
            return self._release(at, stopped=True)
        return self._release(len(held) - self._possible_start(held), stopped=False)

    def flush(self) -> Released[Item]:
        """Everything held (the text stage ended without a stop string)."""
        return self._release(None, stopped=False)

    def _possible_start(self, held: str) -> int:
        """Length of the longest suffix of `held` that is a proper prefix of a stop string."""
        for length in range(min(len(held), max(map(len, self.stops), default=1) - 1), 0, -1):
            if any(len(s) > length and s.startswith(held[-length:]) for s in self.stops):
                return length
        return 0

    def _release(self, boundary: int | None, stopped: bool) -> Released[Item]:
        """Release the held items whose text ends by `boundary` (a text offset into the held text;
        None: all). An item without text goes with the text after it: only when that text is
        released whole (the first token's prefill carries the token into the talker's prompt).
        When a stop string starts at `boundary`, the text before it is kept, and the ids of the
        token it cuts."""
        out: Released[Item] = Released(stopped=stopped)
        ids: list[int] = []
        ends, end = [], 0
        for held in self._held:
            end += len(held.text)
            ends.append(end)
        count = 0
        for i, held in enumerate(self._held):
            settles = next((ends[j] for j in range(i, len(self._held)) if self._held[j].text), None)
            if boundary is not None and (settles is None or settles > boundary):
                break
            out.items.append(held.item)
            out.text += held.text
            ids += held.token_ids
            count += 1
        if stopped:
            cut = next((h for h in self._held[count:] if h.text), None)
            if cut is not None and len(out.text) < boundary:
                ids += cut.token_ids
            out.text = "".join(h.text for h in self._held)[:boundary]
        self._held = [] if stopped else self._held[count:]
        out.token_ids = tuple(ids)
        self.text += out.text
        self.token_ids += ids
        return out
