"""Samples on a running timeline, kept as appended chunks (no copying on append)."""

from __future__ import annotations

import numpy as np


class SampleBuffer:
    """The samples from timeline index `start` to `end`; appends add at the end, `drop_until`
    and `take_until` remove from the front. Each append costs only its own size."""

    def __init__(self, start: int = 0):
        self.start = start
        self._chunks: list[np.ndarray] = []
        self._size = 0

    @property
    def end(self) -> int:
        return self.start + self._size

    @property
    def size(self) -> int:
        return self._size

    def append(self, samples: np.ndarray) -> None:
        if samples.size:
            self._chunks.append(samples)
            self._size += samples.size

    def view(self, begin: int, stop: int) -> np.ndarray:
        """A copy of the samples in [begin, stop) (clamped to what is held)."""
        begin, stop = max(begin, self.start) - self.start, min(stop, self.end) - self.start
        if stop <= begin:
            return np.zeros(0, np.float32)
        pieces, offset = [], 0
        for chunk in self._chunks:
            lo, hi = max(begin - offset, 0), min(stop - offset, chunk.size)
            if lo < hi:
                pieces.append(chunk[lo:hi])
            offset += chunk.size
            if offset >= stop:
                break
        return np.concatenate(pieces)

    def drop_until(self, index: int) -> None:
        """Forget everything before timeline index `index`."""
        remove = min(max(0, index - self.start), self._size)
        while remove and self._chunks:
            head = self._chunks[0]
            if head.size <= remove:
                self._chunks.pop(0)
                remove -= head.size
                self._size -= head.size
                self.start += head.size
            else:
                self._chunks[0] = head[remove:]
                self._size -= remove
                self.start += remove
                remove = 0
        if not self._chunks:  # also moves an empty buffer forward
            self.start = max(self.start, index)

    def take_until(self, index: int) -> np.ndarray:
        """Remove and return the samples before timeline index `index`."""
        taken = self.view(self.start, index)
        self.drop_until(index)
        return taken
