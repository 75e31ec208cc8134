"""Streaming linear-interpolation resampler: chunk boundaries leave no seams."""

from __future__ import annotations

import numpy as np


class StreamingResampler:
    """Resamples a stream chunk by chunk; output equals resampling the whole stream at once.

    Output sample k sits at input position k * source_rate / target_rate; the last input
    sample of each chunk is carried over so the interpolation across chunk boundaries is
    exact.
    """

    def __init__(self, source_rate: int, target_rate: int):
        self.source_rate, self.target_rate = source_rate, target_rate
        self._step = source_rate / target_rate
        self._carry = np.zeros(0, dtype=np.float32)  # input samples not yet passed
        self._consumed = 0  # input samples dropped from the front of the stream so far
        self._next_output = 0  # index of the next output sample

    def process(self, samples: np.ndarray) -> np.ndarray:
        data = np.concatenate([self._carry, np.asarray(samples, dtype=np.float32)])
        if data.size < 2:
            self._carry = data
            return np.zeros(0, dtype=np.float32)
        last_position = self._consumed + data.size - 1  # interpolation needs a right neighbour
        count = int(np.floor(last_position / self._step)) - self._next_output + 1
        if count <= 0:
            self._carry = data
            return np.zeros(0, dtype=np.float32)
        positions = (np.arange(self._next_output, self._next_output + count) * self._step) - self._consumed
        out = np.interp(positions, np.arange(data.size), data).astype(np.float32)
        self._next_output += count
        keep_from = max(0, int(np.floor(self._next_output * self._step)) - self._consumed)
        self._consumed += keep_from
        self._carry = data[keep_from:]
        return out
