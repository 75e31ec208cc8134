"""Qwen3-Omni's talker as an out-of-tree vLLM model (registered by `vllm_omni.models.vllm_plugin`).

The engine loads the full Qwen3-Omni checkpoint with `hf_overrides={"architectures":
["Qwen3OmniTalkerForVllm"]}` and takes the talker's weights (plus the thinker's token
embedding, which the trailing-text rows are made of). The decoder is vLLM's own building
blocks: Qwen3-MoE attention (q/k norms, paged KV) and the Qwen2-MoE sparse block with the
sigmoid-gated shared expert (FusedMoE), so batching, chunked prefill and the KV cache are
vLLM's.

What a plain LLM does not have, and how it is done here:
* The prompt is embeddings (`enable_prompt_embeds`), built by the orchestrator's bridge.
* A frame is its codebook-0 id plus codebooks 1..15 from the code predictor, which runs
  right after vLLM's sampler (`complete_sampled`, called by the model runner,
  talker_worker.py) from the request's last output state and the sampled id, so a frame is
  complete in the step that sampled it (and leaves through frame_channel.py at once).
* A decode step's input is not the sampled id's embedding but the sum of the previous
  frame's 16 codec embeddings plus the next trailing-text row. Before each forward the
  model runner hands the model a `TalkerStepPlan`: which rows of the flattened batch
  belong to which request, their prompt lengths and the scheduled token ids; each decode
  row's input becomes the codec sum + text row. The text rows come from the `TextFeed` the
  orchestrator fills through `collective_rpc`; the scheduler (vllm_talker_gate.py) runs a
  decode step only once its text row exists.
* `compute_logits` applies the talker's repetition penalty over the codebook-0 ids
  generated so far (vLLM's own penalty would also count the prompt's placeholder ids),
  masks the codec EOS for `ignore_eos` requests (vLLM only knows a tokenizer's EOS) and
  suppresses the control range [vocab - 1024, vocab) except the codec EOS.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from torch import nn
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration,
    Qwen3OmniMoeTalkerResizeMLP,
)
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.qwen2_moe import Qwen2MoeSparseMoeBlock
from vllm.model_executor.models.qwen3_moe import Qwen3MoeAttention
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper

from vllm_omni.config import SamplingParams
from vllm_omni.engine.backends.torch_sampling import TokenSampler, apply_repetition_penalty
from vllm_omni.engine.backends.vllm.holding_scheduler import external_request_id
from vllm_omni.models.qwen3_omni.code_predictor import CodePredictor
from vllm_omni.models.qwen3_omni.torch_backend.talker import SUPPRESSED_TAIL, code_predictor_sampling
from vllm_omni.models.qwen3_omni.vllm_backend.talker_feed import TEXT_FEED, TextFeed


@dataclass(frozen=True)
class PlannedRequest:
    """One request's slice [start, start + count) of the flattened batch."""

    request_id: str  # vLLM's internal id
    start: int
    count: int
    prompt_length: int
    computed: int  # the request's rows computed before this step (its first row's index in the sequence)
    sampling: SamplingParams


@dataclass(frozen=True)
class TalkerStepPlan:
    requests: list[PlannedRequest]
    token_ids: torch.Tensor  # [num_tokens] scheduled ids; a decode row holds the last sampled codebook-0 id


@dataclass
class TalkerRequestState:
    sampling: SamplingParams
    residual_sampler: TokenSampler
    last_hidden: torch.Tensor | None = None  # [D] output at the request's last scheduled position
    decode_inputs: list[torch.Tensor] = field(default_factory=list)  # per decode step (kept for recompute)
    codes0: list[int] = field(default_factory=list)  # codebook-0 ids sampled so far
    codec_sum: torch.Tensor | None = None  # [D] the last frame's codec embeddings, summed: the next input's
    frames: list[list[int]] = field(default_factory=list)  # finished frames not yet taken


class TalkerDecoderLayer(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        self.self_attn = Qwen3MoeAttention(
            hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
            # M-RoPE: equal streams (plain RoPE) unless the prompt holds images (talker_worker.py).
            rope_parameters=config.rope_parameters,
            max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
            cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.self_attn")
        moe = SimpleNamespace(hidden_size=config.hidden_size, num_experts=config.num_experts,
                              num_experts_per_tok=config.num_experts_per_tok,
                              moe_intermediate_size=config.moe_intermediate_size,
                              shared_expert_intermediate_size=config.shared_expert_intermediate_size,
                              norm_topk_prob=config.norm_topk_prob, hidden_act=config.hidden_act)
        self.mlp = Qwen2MoeSparseMoeBlock(moe, quant_config=vllm_config.quant_config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions=positions, hidden_states=hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class TalkerModel(nn.Module):
    def __init__(self, config, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        self.codec_embedding = VocabParallelEmbedding(config.vocab_size, config.hidden_size,
                                                      prefix=f"{prefix}.codec_embedding")
        self.layers = nn.ModuleList(TalkerDecoderLayer(config, vllm_config, f"{prefix}.layers.{i}")
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Qwen3OmniTalkerForVllm(nn.Module):
    supports_mrope = True

    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={"talker.": "", "thinker.model.embed_tokens.": "thinker_embedding."},
        orig_to_new_stacked={
            ".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
            ".shared_expert.gate_proj": (".shared_expert.gate_up_proj", 0),
            ".shared_expert.up_proj": (".shared_expert.gate_up_proj", 1),
        })

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        full = vllm_config.model_config.hf_config
        talker_config = full.talker_config
        text = talker_config.text_config
        self.eos_token_id = talker_config.codec_eos_token_id
        self.model = TalkerModel(text, vllm_config, "model")
        self.codec_head = ParallelLMHead(text.vocab_size, text.hidden_size, prefix="codec_head")
        self.logits_processor = LogitsProcessor(text.vocab_size)
        self.code_predictor = Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration._from_config(
            talker_config.code_predictor_config)
        self.code_predictor_runner = CodePredictor(self.code_predictor, talker_config.num_code_groups)
        self.text_projection = Qwen3OmniMoeTalkerResizeMLP(talker_config)
        thinker_text = full.thinker_config.text_config
        self.thinker_embedding = VocabParallelEmbedding(thinker_text.vocab_size, thinker_text.hidden_size,
                                                        prefix="thinker_embedding")
        suppressed = torch.zeros(text.vocab_size, dtype=torch.bool)
        suppressed[text.vocab_size - SUPPRESSED_TAIL:] = True
        suppressed[self.eos_token_id] = False
        self.register_buffer("suppressed", suppressed, persistent=False)
        self.tts_token_ids = (full.tts_eos_token_id, full.tts_pad_token_id)
        self.text_feed: TextFeed = TEXT_FEED
        self.requests: dict[str, TalkerRequestState] = {}
        self.plan: TalkerStepPlan | None = None

    # vLLM model interface -------------------------------------------------------------

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features=None, **kwargs):
        """Sequential positions, the three M-RoPE streams equal: those of a prompt without images
        (the worker installs the orchestrator's positions for one with images)."""
        return torch.arange(len(input_tokens)).view(1, -1).expand(3, -1).clone(), 0

    def embed_input_ids(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.model.codec_embedding(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        if self.plan is not None:
            hidden = self._substitute_decode_inputs(self.plan, hidden)
        output = self.model(positions, hidden)
        if self.plan is not None:
            for planned in self.plan.requests:
                self.requests[planned.request_id].last_hidden = output[planned.start + planned.count - 1].clone()
        return output

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.logits_processor(self.codec_head, hidden_states)
        if self.plan is not None and len(self.plan.requests) == logits.shape[0]:
            for row, planned in enumerate(self.plan.requests):
                state = self.requests[planned.request_id]
                logits[row] = apply_repetition_penalty(logits[row], state.codes0,
                                                       planned.sampling.repetition_penalty)
                if planned.sampling.ignore_eos:
                    logits[row, self.eos_token_id] = float("-inf")
        return logits.masked_fill(self.suppressed, float("-inf"))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM's loader for the decoder (fused qkv, experts); the code predictor (a plain
        transformers module, whose q/k/v must not be fused) is loaded as it is stored."""
        predictor_prefix = "talker.code_predictor."
        predictor_params = dict(self.code_predictor.named_parameters())
        loaded: set[str] = set()

        def decoder_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith(predictor_prefix):
                    local = name[len(predictor_prefix):]
                    predictor_params[local].data.copy_(tensor)
                    loaded.add("code_predictor." + local)
                else:
                    yield name, tensor

        loader = AutoWeightsLoader(self, ignore_unexpected_prefixes=["thinker.", "code2wav.", "hidden_projection."])
        loaded |= loader.load_weights(decoder_weights(), mapper=self.hf_to_vllm_mapper)
        return loaded

    # Per-request state, driven by the worker ----------------------------------------------

    def begin_request(self, request_id: str, sampling: SamplingParams) -> TalkerRequestState:
        state = TalkerRequestState(sampling, TokenSampler(code_predictor_sampling(sampling)))
        self.requests[request_id] = state
        return state

    def take_frames(self) -> dict[str, list[list[int]]]:
        """Every request's finished frames not taken before, in order, by vLLM request id."""
        taken = {}
        for request_id, state in self.requests.items():
            if state.frames:
                taken[request_id], state.frames = state.frames, []
        return taken

    def forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    # The decode-step input ------------------------------------------------------------

    def _text_rows(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor(token_ids, device=self.suppressed.device)
        return self.text_projection(self.thinker_embedding(ids))

    def _text_token(self, request_id: str, step: int) -> int:
        token = self.text_feed.token_for_step(external_request_id(request_id), step, *self.tts_token_ids)
        if token is None:
            raise RuntimeError(f"talker request {request_id}: no text row for step {step} (scheduled too early)")
        return token

    def _substitute_decode_inputs(self, plan: TalkerStepPlan, hidden: torch.Tensor) -> torch.Tensor:
        """Replace every decode row's input with codec sum of the previous frame + text row."""
        new_rows: list[tuple[int, str, int]] = []  # (batch row, request, decode step)
        for planned in plan.requests:
            state = self.requests[planned.request_id]
            # A request's rows are consecutive in its sequence: skip its prompt rows without a loop.
            first_step = planned.computed - planned.prompt_length
            for row in range(planned.start + max(0, -first_step), planned.start + planned.count):
                step = first_step + row - planned.start
                if step < len(state.decode_inputs):  # recomputed after preemption: same input as before
                    hidden[row] = state.decode_inputs[step]
                elif state.codec_sum is None or int(plan.token_ids[row]) != state.codes0[-1]:
                    raise RuntimeError(f"talker request {planned.request_id}: step {step} has no frame of its "
                                       "sampled codebook-0 id")
                else:
                    new_rows.append((row, planned.request_id, step))
        if not new_rows:
            return hidden
        text_rows = self._text_rows([self._text_token(rid, step) for _, rid, step in new_rows])
        for (row, rid, _), text_row in zip(new_rows, text_rows, strict=True):
            state = self.requests[rid]
            row_input = (state.codec_sum + text_row).to(hidden.dtype)
            state.decode_inputs.append(row_input)
            state.codec_sum = None
            hidden[row] = row_input
        return hidden

    def complete_sampled(self, sampled: list[tuple[str, int, bool]]) -> None:
        """After the sampler: (request, codebook-0 id, whether it makes a frame) per request
        that sampled one. A frame's codes 1..15 and codec sum come from the code predictor;
        the id that ends a request (EOS, or the last of its max_tokens) makes none, as in the
        reference."""
        framed = []
        for request_id, code0, makes_frame in sampled:
            self.requests[request_id].codes0.append(code0)
            if makes_frame:
                framed.append((request_id, code0))
        if not framed:
            return
        codes0 = [code for _, code in framed]
        last_hidden = torch.stack([self.requests[rid].last_hidden for rid, _ in framed])
        code0_embeddings = self.model.codec_embedding(torch.tensor(codes0, device=self.suppressed.device))
        frames, codec_sums = self.code_predictor_runner.complete_frames(
            last_hidden, code0_embeddings, codes0, [self.requests[rid].residual_sampler for rid, _ in framed])
        for (rid, _), frame, codec_sum in zip(framed, frames, codec_sums, strict=True):
            state = self.requests[rid]
            state.frames.append(frame)
            state.codec_sum = codec_sum
