"""Per-request, per-stage output timestamps and the metrics derived from them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vllm_omni.engine.request import StageMetrics


@dataclass
class StageTimer:
    arrival: float = field(default_factory=time.monotonic)
    stamps: dict[str, list[float]] = field(default_factory=dict)

    def record(self, stage: str) -> float:
        now = time.monotonic()
        self.stamps.setdefault(stage, []).append(now)
        return now - self.arrival

    def metrics(self, stage_ids: dict[str, int]) -> dict[str, StageMetrics]:
        """By role; `stage_ids` maps each role to its deploy-config stage id."""
        result = {}
        for stage, stamps in self.stamps.items():
            intervals = tuple(b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True))
            result[stage] = StageMetrics(
                role=stage, stage_id=stage_ids[stage], first_output_s=stamps[0] - self.arrival,
                mean_interval_s=sum(intervals) / len(intervals) if intervals else None,
                intervals_s=intervals, outputs=len(stamps))
        return result
