"""Whole model units out of appends of any size (docs/realtime-api.md §13.7-13.8).

A native session hands its model one call per unit, however the audio arrived: appends wait
here until they close a unit, then the unit's samples go in one piece, with the frame groups
of the appends in it (the first binds to this unit, later ones queue for the following units)
and the force of the append that closes it. What runs past the unit's end waits for the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Piece:
    samples: np.ndarray  # 16 kHz float32
    frames: list[bytes] = field(default_factory=list)  # the append's frame group, if any
    force_listen: bool = False  # every unit this append closes listens


@dataclass
class Unit:
    samples: np.ndarray
    frame_groups: list[list[bytes]]
    force_listen: bool


class UnitAssembler:
    """The input of the unit not yet closed."""

    def __init__(self) -> None:
        self._pieces: list[Piece] = []

    @property
    def samples(self) -> int:
        return sum(piece.samples.size for piece in self._pieces)

    def add(self, piece: Piece) -> None:
        self._pieces.append(piece)

    def pad(self, size: int, force_listen: bool) -> None:
        """Silence up to a unit's end `size` samples after the unit's start."""
        self.add(Piece(np.zeros(size - self.samples, np.float32), force_listen=force_listen))

    def take(self, size: int) -> Unit | None:
        """The unit of `size` samples, once the pieces hold that many."""
        if self.samples < size or size <= 0:
            return None
        samples, groups, need = [], [], size
        while need:
            piece = self._pieces[0]
            if piece.samples.size > need:
                self._pieces[0] = Piece(piece.samples[need:], force_listen=piece.force_listen)
                samples.append(piece.samples[:need])
            else:
                samples.append(self._pieces.pop(0).samples)
            need -= samples[-1].size
            groups += [piece.frames] if piece.frames else []
        return Unit(np.concatenate(samples), groups, piece.force_listen)
