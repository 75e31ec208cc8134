"""The tiny checkpoint's `assets/token2wav/`: a small random instance of the real token2wav
networks, and small ONNX stand-ins for the two prompt models (docs/minicpmo.md, "Token2wav").

* flow.yaml / flow.pt: the same flow classes as the real assets (conformer encoder with 3
  look-ahead codes and 2x upsampling, DiT estimator) at width 64 with 2 + 2 encoder blocks and 2
  DiT blocks; the codebook is the real 6561 codes.
* hift.yaml / hift.pt: HiFT with the real 24 kHz layout (480 samples per mel frame) at 32
  channels.
* speech_tokenizer_v2_25hz.onnx: feats [1, 128, T] float32 and feats_length [1] int32 ->
  indices [1, ceil(T / 4)] int32, the real model's interface: two stride-2 convolutions, then
  the nearest of 6561 random codes.
* campplus.onnx: input [1, T, 80] float32 -> output [1, 192] float32: a projection, ReLU,
  mean over time and a projection.

Every weight comes from generators seeded by `seed` (models/tiny_weights.py), so the same seed
gives the same bytes. The DiT's modulation and output layers, which the library starts at zero,
are random like the rest, so the decoder's output depends on its inputs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import yaml
from onnx import TensorProto, helper, numpy_helper

from vllm_omni.models.minicpmo.token2wav_networks import (
    FLOW_CONFIG,
    FLOW_WEIGHTS,
    HIFT_CONFIG,
    HIFT_KEY_PREFIX,
    HIFT_WEIGHTS,
    hift_generator,
    read_flow_yaml,
)
from vllm_omni.models.minicpmo.token2wav_prompt import SPEAKER_MODEL, SPEECH_TOKENIZER
from vllm_omni.models.tiny_weights import check_weights, initialise_parameters

WIDTH = 64
CODEBOOK = 6561
SPEAKER_DIM = 192
ONNX_OPSET = 17

_ENCODER = dict(input_size=WIDTH, output_size=WIDTH, input_layer="linear", pre_lookahead_len=3, num_blocks=2,
                num_up_blocks=2, up_stride=2, up_scale_factor=2, attention_heads=2, pos_enc_layer_type="rel_pos_espnet",
                selfattention_layer_type="rel_selfattn", key_bias=True, linear_units=2 * WIDTH, dropout_rate=0.1,
                positional_dropout_rate=0.1, attention_dropout_rate=0.1, normalize_before=True)
_ESTIMATOR = dict(in_channels=320, out_channels=80, mlp_ratio=2.0, depth=2, num_heads=2, head_dim=32,
                  hidden_size=WIDTH)
_FLOW = dict(input_size=WIDTH, output_size=80, spk_embed_dim=SPEAKER_DIM, output_type="mel", vocab_size=CODEBOOK)
HIFT = dict(base_channels=32, f0_predictor=dict(num_class=1, in_channels=80, cond_channels=32))
_PACKAGE = "cosyvoice2."


def _node(tag: str, fields: dict[str, Any], indent: int) -> str:
    """A `!new:` YAML node over `fields` (values: scalars or nested nodes)."""
    lines = [f"!new:{_PACKAGE}{tag}"]
    for name, value in fields.items():
        text = value if isinstance(value, str) and value.startswith("!new:") else json.dumps(value)  # JSON is YAML
        lines.append(" " * indent + f"{name}: {text}")
    return "\n".join(lines)


def flow_yaml() -> str:
    estimator = _node("flow.decoder_dit.DiT", _ESTIMATOR, 6)
    decoder = _node("flow.flow_matching.CausalConditionalCFM", {"inference_cfg_rate": 0.7, "estimator": estimator}, 4)
    encoder = _node("transformer.upsample_encoder_v2.UpsampleConformerEncoderV2", _ENCODER, 4)
    return "flow: " + _node("flow.flow.CausalMaskedDiffWithXvec", {**_FLOW, "encoder": encoder, "decoder": decoder},
                            2) + "\n"


def _vector_value(name: str, param: torch.nn.Parameter) -> float:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return 0.0
    if leaf in ("alpha", "weight"):  # Snake frequencies; the only 1-D weights are LayerNorm scales
        return 1.0
    raise ValueError(f"no initialisation rule for per-channel parameter {name} {tuple(param.shape)}")


def _randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight from `seed`, matrices at std 1 / sqrt(fan_in) so the signal keeps its scale."""
    initialise_parameters(module, seed, _vector_value, {"": 1.0})
    check_weights(module, "tiny token2wav")
    return module


def _tensor(generator: torch.Generator, name: str, *shape: int) -> TensorProto:
    values = torch.randn(shape, generator=generator) / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else 1)
    return numpy_helper.from_array(values.numpy().astype(np.float32), name)


def _save_model(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)], producer_name="vllm-omni")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString(deterministic=True))


def speech_tokenizer_graph(generator: torch.Generator) -> onnx.GraphProto:
    channels = 16
    nodes = [
        # feats_length only gates the features (x * (length > 0)), so the input stays in the graph.
        helper.make_node("Greater", ["feats_length", "zero"], ["has_frames"]),
        helper.make_node("Cast", ["has_frames"], ["gate"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["feats", "gate"], ["gated"]),
        helper.make_node("Conv", ["gated", "conv1"], ["h1"], strides=[2], pads=[1, 1], kernel_shape=[3]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Conv", ["a1", "conv2"], ["h2"], strides=[2], pads=[1, 1], kernel_shape=[3]),
        helper.make_node("Transpose", ["h2"], ["frames"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["frames", "codebook"], ["scores"]),
        helper.make_node("ArgMax", ["scores"], ["nearest"], axis=-1, keepdims=0),
        helper.make_node("Cast", ["nearest"], ["indices"], to=TensorProto.INT32),
    ]
    weights = [numpy_helper.from_array(np.array([0], dtype=np.int32), "zero"),
               _tensor(generator, "conv1", channels, 128, 3), _tensor(generator, "conv2", channels, channels, 3),
               _tensor(generator, "codebook", channels, CODEBOOK)]
    return helper.make_graph(
        nodes, "speech_tokenizer_stand_in",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("indices", TensorProto.INT32, [1, "codes"])], weights)


def speaker_graph(generator: torch.Generator) -> onnx.GraphProto:
    hidden = 64
    nodes = [
        helper.make_node("MatMul", ["input", "proj_in"], ["h"]),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("ReduceMean", ["a"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "proj_out"], ["output"]),
    ]
    weights = [_tensor(generator, "proj_in", 80, hidden), _tensor(generator, "proj_out", hidden, SPEAKER_DIM)]
    return helper.make_graph(
        nodes, "campplus_stand_in", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, SPEAKER_DIM])], weights)


def build_tiny_token2wav(out_dir: str | Path, seed: int = 0) -> Path:
    """Write the token2wav assets folder `out_dir` (usually `<checkpoint>/assets/token2wav`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / FLOW_CONFIG).write_text(flow_yaml())
    (out / HIFT_CONFIG).write_text(yaml.safe_dump(HIFT, sort_keys=True))
    flow = _randomise(read_flow_yaml(out / FLOW_CONFIG)["flow"], seed)
    torch.save({name: tensor.contiguous() for name, tensor in flow.state_dict().items()}, out / FLOW_WEIGHTS)
    hift = _randomise(hift_generator(HIFT), seed + 1)
    torch.save({HIFT_KEY_PREFIX + name: tensor.contiguous() for name, tensor in hift.state_dict().items()},
               out / HIFT_WEIGHTS)
    generator = torch.Generator().manual_seed(seed + 2)
    _save_model(speech_tokenizer_graph(generator), out / SPEECH_TOKENIZER)
    _save_model(speaker_graph(generator), out / SPEAKER_MODEL)
    return out
