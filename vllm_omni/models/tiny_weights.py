"""Seeded, explicit initialisation of a tiny checkpoint's weights.

Every parameter is set from one generator seeded once, in parameter-name order, so the same
seed gives byte-identical weights whatever the constructors did (some leave `torch.empty`
memory or zeros behind). Matrices are normal with std MATRIX_STD, or gain / sqrt(fan_in)
where a family needs signal to survive a deep stack; per-channel parameters (biases, norm
scales) get fixed values by a family's rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

MATRIX_STD = 0.02
# Weights below this standard deviation carry no signal (zeros, or uninitialised memory).
MIN_SIGNAL_STD = 1e-4

VectorRule = Callable[[str, torch.nn.Parameter], float]  # (name, parameter) → the value it starts at


@torch.no_grad()
def initialise_parameters(model: torch.nn.Module, seed: int, vector_value: VectorRule,
                          fan_in_gains: Mapping[str, float] = {}) -> None:
    """Per-channel parameters (ndim 1) get `vector_value`; matrices by name prefix in
    `fan_in_gains` get std gain / sqrt(fan_in), the others MATRIX_STD."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if param.ndim == 1:
            param.fill_(vector_value(name, param))
            continue
        gain = next((g for prefix, g in fan_in_gains.items() if name.startswith(prefix)), None)
        std = MATRIX_STD if gain is None else gain / math.sqrt(param[0].numel())
        param.copy_(torch.randn(param.shape, generator=generator) * std)


def check_weights(model: torch.nn.Module, what: str) -> None:
    """RuntimeError listing `model`'s weight problems (find_weight_problems), if it has any."""
    problems = find_weight_problems(model)
    if problems:
        raise RuntimeError(f"{what} has bad weights:\n  " + "\n  ".join(problems))


def find_weight_problems(model: torch.nn.Module) -> list[str]:
    """Names of weights that are non-finite, or matrices that carry no signal."""
    problems = []
    for name, param in model.named_parameters():
        values = param.detach().float()
        if not torch.isfinite(values).all():
            problems.append(f"{name}: non-finite values")
        elif values.ndim >= 2 and values.std().item() < MIN_SIGNAL_STD:
            problems.append(f"{name}: no signal (std {values.std().item():.3g})")
    return problems
