"""The thinker's prompt rows, kept in its worker for prompts that vLLM's prefix cache serves.

With prefix caching, vLLM runs no forward for a prompt's cached positions [0, C), so the
capture (capture.py) sees no rows for them. A position's layer-0 and accept-layer rows
depend only on what lies up to it: the token ids and the multimodal items. So each
prompt's rows are kept under exactly that key, the ids and the items (vLLM's `identifier`,
the hash of the item's data its own prefix-cache block hashes use, and the placeholder
span), and a new request takes rows [0, C) from the kept prompt that shares the longest
prefix with it. The cache salt and the request are no part of the key: equal content gives
equal rows whichever request computed them.

Rows no kept prompt has are NaN. That is where vLLM cached positions that no prompt
covered, which in a conversation are the earlier answers (their KV comes from the decode;
the talker never reads those rows), and where the prompt that had them was evicted or had
not finished its prefill yet; the thinker driver checks the rows the talker reads
(thinker.py).

Bounded by rows: the least recently used prompts go first. A kept prompt that a newly filed
one extends with the same rows (the same conversation a turn later) is dropped then.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class MmItem:
    identifier: str  # vLLM's hash of the item's data (or the caller's uuid for it)
    offset: int
    length: int


@dataclass(frozen=True, eq=False)
class PromptKey:
    token_ids: np.ndarray  # [P] int64
    mm_items: tuple[MmItem, ...]  # by offset

    @classmethod
    def of(cls, token_ids: Sequence[int], mm_features: Iterable[Any]) -> PromptKey:
        """From a vLLM request's prompt ids and `MultiModalFeatureSpec`s."""
        items = (MmItem(f.identifier, f.mm_position.offset, f.mm_position.length) for f in mm_features)
        return cls(np.asarray(token_ids, dtype=np.int64), tuple(sorted(items, key=lambda item: item.offset)))

    def __len__(self) -> int:
        return len(self.token_ids)

    def extended(self, token_ids: Sequence[int]) -> PromptKey:
        """This prompt followed by `token_ids` (an answer: no multimodal items)."""
        return PromptKey(np.concatenate([self.token_ids, np.asarray(token_ids, dtype=np.int64)]), self.mm_items)

    def shared_prefix(self, other: PromptKey, limit: int) -> int:
        """How many leading positions (at most `limit`) have equal rows in both prompts: equal
        ids, and no multimodal item that differs starting before."""
        shared = min(limit, len(self), len(other))
        differ = np.flatnonzero(self.token_ids[:shared] != other.token_ids[:shared])
        if differ.size:
            shared = int(differ[0])
        for mine, theirs in zip_longest(self.mm_items, other.mm_items):
            if mine != theirs:
                return min(shared, *(item.offset for item in (mine, theirs) if item is not None))
        return shared


@dataclass
class _Kept:
    key: PromptKey
    rows: torch.Tensor  # [P, layers, H], NaN where unknown
    known: np.ndarray  # [P] bool: the row is not NaN


class PromptRowStore:
    def __init__(self, capacity: int):
        self.capacity = capacity  # rows, all kept prompts together
        self.rows = 0
        self._kept: OrderedDict[int, _Kept] = OrderedDict()
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._kept)

    def lookup(self, key: PromptKey, length: int) -> tuple[int, torch.Tensor | None]:
        """(n, rows): the longest prefix of `key[:length]` a kept prompt shares, and that
        prompt's rows [n, layers, H] (NaN where it has none)."""
        best, shared = None, 0
        for kept_id, kept in self._kept.items():
            n = key.shared_prefix(kept.key, length)
            if n > shared:
                best, shared = kept_id, n
        if best is None:
            return 0, None
        self._kept.move_to_end(best)
        return shared, self._kept[best].rows[:shared]

    def file(self, key: PromptKey, rows: torch.Tensor) -> None:
        """Keep a prompt's rows [P, layers, H]; a prompt over the whole capacity is not kept."""
        if len(key) > self.capacity:
            return
        known = ~rows.isnan().flatten(1).any(dim=1).numpy()
        for kept_id, kept in list(self._kept.items()):
            length = len(kept.key)
            if kept.key.shared_prefix(key, length) == length and not (kept.known & ~known[:length]).any():
                self._drop(kept_id)
        self._kept[next(self._ids)] = _Kept(key, rows, known)
        self.rows += len(key)
        while self.rows > self.capacity:
            self._drop(next(iter(self._kept)))

    def _drop(self, kept_id: int) -> None:
        self.rows -= len(self._kept.pop(kept_id).key)
