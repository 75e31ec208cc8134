"""Tensors through vLLM's `collective_rpc` replies: raw bytes plus dtype and shape.

Replies travel msgpack-encoded without pickle; bytes are its cheapest payload. Measured
for a 1000-token prompt's hidden rows at the 30B model's width (2 x 2048, bf16): 2 ms to
encode and decode as bytes, 626 ms as nested Python lists."""

from __future__ import annotations

from typing import Any

import torch


def tensor_to_wire(tensor: torch.Tensor) -> dict[str, Any]:
    flat = tensor.detach().to("cpu").contiguous()
    return {"dtype": str(flat.dtype).removeprefix("torch."), "shape": list(flat.shape),
            "data": flat.view(-1).view(torch.uint8).numpy().tobytes()}


def tensor_from_wire(wire: dict[str, Any]) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(wire["data"]), dtype=torch.uint8)
    return raw.view(getattr(torch, wire["dtype"])).reshape(wire["shape"])
