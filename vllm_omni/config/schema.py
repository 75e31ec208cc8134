"""Typed schema of a deploy config (one YAML file, after inheritance and platform merge).

Unknown keys are errors everywhere, and values are not coerced (`"0.5"` is not a number),
so a typo in a deploy file fails at load time instead of silently running defaults.

Where a stage runs: a vLLM stage on the platform's accelerators `devices` (each engine sees
only those); a torch stage (Qwen3-Omni's) in the server process, on the CPU unless its
`torch_device` is `cuda`, which puts its weights and tensors on `cuda:<devices[0]>`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

# vLLM 0.32's limit for a modality missing from `limit_mm_per_prompt`
# (MultiModalConfig.get_limit_per_prompt); the torch backend applies the same default.
DEFAULT_MM_LIMIT = 999

Platform = Literal["cuda", "rocm", "xpu", "npu", "cpu"]
PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "xpu", "npu", "cpu")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EngineArgs(_Strict):
    """Engine arguments of one stage; `extra` passes any other vLLM engine argument through."""

    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    enforce_eager: bool | None = None
    tensor_parallel_size: PositiveInt = 1
    enable_prefix_caching: bool | None = None
    trust_remote_code: bool = False
    dtype: str | None = None
    # Most items of each modality in one thinker prompt, on both backends; a conversation with
    # more loses its oldest items of that modality first (engine/prompting.py). Unlisted:
    # DEFAULT_MM_LIMIT.
    limit_mm_per_prompt: dict[str, NonNegativeInt] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict)

    def mm_limit(self, modality: str) -> int:
        return self.limit_mm_per_prompt.get(modality, DEFAULT_MM_LIMIT)


class SamplingParams(_Strict):
    """Default sampling of a stage; requests may override single fields."""

    temperature: float = Field(default=0.0, ge=0)
    top_k: int | None = Field(default=None, ge=-1)
    top_p: float = Field(default=1.0, gt=0, le=1)
    min_p: float = Field(default=0.0, ge=0, le=1)
    max_tokens: PositiveInt = 2048
    min_tokens: NonNegativeInt = 0
    repetition_penalty: float = Field(default=1.0, gt=0)
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False


class RayPlacement(_Strict):
    """What each replica of a stage asks of a Ray cluster (with `ray` set in the deploy config):
    CPUs, GPUs, and custom node resources (`ray start --resources '{"node_b": 8}'`)."""

    num_cpus: NonNegativeFloat = 1.0
    num_gpus: NonNegativeFloat = 0.0
    resources: dict[str, PositiveFloat] = Field(default_factory=dict)


class StageConfig(_Strict):
    stage_id: NonNegativeInt
    role: Literal["encoder", "thinker", "talker", "code2wav", "vocoder", "llm"]
    backend: Literal["vllm", "torch"]
    devices: list[NonNegativeInt] = Field(default_factory=lambda: [0])
    # Torch stages: "cpu" (`devices` unused) or "cuda": the GPU `cuda:<devices[0]>`, numbered as
    # the server process sees them (after an outer CUDA_VISIBLE_DEVICES); an error without CUDA.
    # vLLM stages run on the platform's devices and refuse this key.
    torch_device: Literal["cpu", "cuda"] = "cpu"
    # Torch stages whose program can step several requests in one pass (Qwen3-Omni's code2wav:
    # the convolution stack over streams stacked on the batch dimension, within 1 LSB of each
    # decoded alone) do so. Off by default: on a CPU that pass costs what the streams cost one
    # by one, and each stream's audio then waits for the whole pass (README, "The pipeline").
    batch_requests: bool = False
    # CPU platform, vLLM stages: the cores the engine's compute threads are bound to (vLLM's
    # VLLM_CPU_OMP_THREADS_BIND); unset, vLLM binds every engine to the same cores itself.
    cpu_cores: list[NonNegativeInt] | None = None
    # vLLM stages: the OS niceness of the engine's processes (0 to 19, as `nice`). Where the
    # engines share cores with the server process (CPU), a positive value lets the server's
    # own work take a busy core first: the last stage (code2wav) and the sockets, what a
    # listener waits for, while the engines upstream are usually ahead of playback.
    nice: int = Field(default=0, ge=0, le=19)
    engine_args: EngineArgs = Field(default_factory=EngineArgs)
    default_sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    # vLLM stages, and every stage on Ray: when the stage's engine (or Ray actor) dies, its
    # in-flight requests fail (as they always do) and then a new one is started in its place;
    # requests are refused until it is up. Off: the stage stays dead until the server restarts.
    restart_on_failure: bool = False
    # Instances of this stage, each with its own engine (vLLM) or worker thread (torch); a
    # request runs on one replica of each stage, the least loaded when it arrives, and the
    # turns of one session stay on the same replicas (engine/replicas.py). `devices` and
    # `cpu_cores`, where given, are split into `replicas` equal groups, one per replica.
    replicas: PositiveInt = 1
    placement: RayPlacement = Field(default_factory=RayPlacement)  # read only with `ray` set

    @model_validator(mode="after")
    def _devices_split_among_replicas(self) -> StageConfig:
        for key in ("devices", "cpu_cores"):
            value = getattr(self, key)
            if key in self.model_fields_set and value is not None and len(value) % self.replicas:
                raise ValueError(f"{key}: {self.replicas} replicas take equal groups of {key}, got {len(value)} "
                                 f"({value}); list an entry twice for replicas that share it")
        return self

    def replica_stages(self) -> list[StageConfig]:
        """One config per replica: its own group of `devices` and `cpu_cores` (all replicas get
        the whole list where the config does not give it)."""
        def group(value: list[int] | None, index: int, key: str) -> list[int] | None:
            if value is None or key not in self.model_fields_set:
                return value
            size = len(value) // self.replicas
            return value[index * size:(index + 1) * size]

        return [self.model_copy(update={"replicas": 1, "devices": group(self.devices, i, "devices"),
                                        "cpu_cores": group(self.cpu_cores, i, "cpu_cores")})
                for i in range(self.replicas)]


class CodecChunking(_Strict):
    """How talker codec frames are cut into code2wav chunks (`extra` of a connector)."""

    initial_codec_chunk_frames: PositiveInt = 4
    codec_chunk_frames: PositiveInt = 25
    # After the first chunk, each chunk is half as long as all before it together (up to
    # codec_chunk_frames), so the audio already sent covers the time the next chunk takes.
    ramp_codec_chunks: bool = True
    codec_left_context_frames: NonNegativeInt = 25


class ConnectorConfig(_Strict):
    """A directed link that carries one stage's outputs to another stage's inputs.

    The connectors are the deploy's stage graph: the engine lets stage A send to stage B only
    along a declared connector, and at most one connector joins a (from_stage, to_stage) pair.
    """

    name: str
    from_stage: NonNegativeInt
    to_stage: NonNegativeInt
    extra: CodecChunking | None = None  # set on the connector that carries codec frames


class SessionDefaults(_Strict):
    """Server-wide session settings: the Silero model, admission, and the server-VAD values a
    session gets when a client turns on `server_vad` without giving them."""

    server_vad_model_path: str | None = None  # None: the HF cache, then the silero-vad package
    end_of_turn_model_path: str | None = None  # semantic_vad's Smart Turn ONNX; None: the pipecat-ai package's
    vad_threshold: float = Field(default=0.5, gt=0, lt=1)
    vad_silence_duration_ms: PositiveInt = 500
    vad_prefix_padding_ms: NonNegativeInt = 300
    max_sessions: PositiveInt = 64
    # Duplex sessions (docs/realtime-api.md §13.4): a detached session waits this long for a
    # resume; one without activity for idle_ttl_s (None: never) expires; leases are checked
    # every reaper_interval_s.
    disconnect_grace_s: PositiveFloat = 30.0
    idle_ttl_s: PositiveFloat | None = 300.0
    reaper_interval_s: PositiveFloat = 5.0
    # Natively duplex models (docs/realtime-api.md §13.7): while the model speaks and no input
    # arrives for continuation_period_ms, a silence unit keeps it going, at most
    # continuation_limit_units per response; test_decisions lets sessions script the model's
    # per-unit decisions (`extra_body.duplex_test_decisions`), for tests only.
    continuation_period_ms: PositiveFloat = 1000.0
    continuation_limit_units: PositiveInt = 64
    test_decisions: bool = False


class PlaybackPacing(_Strict):
    """Playback-deadline scheduling (engine/pacing.py): while a listener waits for first audio
    or has less than `urgent_lead_s` of audio queued, answers more than `yield_lead_s` ahead
    of their listener sit out the stage steps."""

    enabled: bool = True
    urgent_lead_s: NonNegativeFloat = 0.5
    yield_lead_s: NonNegativeFloat = 2.5

    @model_validator(mode="after")
    def _yield_above_urgent(self) -> PlaybackPacing:
        if self.yield_lead_s < self.urgent_lead_s:
            raise ValueError(f"yield_lead_s ({self.yield_lead_s}) must not be below urgent_lead_s "
                             f"({self.urgent_lead_s}): an answer that yields must not be urgent itself")
        return self


class RayCluster(_Strict):
    """Run every stage replica as an actor on a Ray cluster (engine/backends/ray_stage.py);
    only the orchestrator and the API stay in the server process."""

    address: str = "auto"  # ray.init's: "auto" (a `ray start`ed cluster this machine is in), "HOST:PORT"
    namespace: str = "vllm-omni"
    # A replica that answers nothing for this long counts as dead: its requests fail and it is
    # replaced (Ray itself notices a lost node only after tens of seconds).
    liveness_timeout_s: PositiveFloat = 1.5


class DeployConfig(_Strict):
    """A whole deploy config, as it stands after `base_config` and platform merges."""

    async_chunk: bool = True
    session_mode: Literal["turn", "duplex"] = "turn"
    # `duplex_session` is the deprecated name of this section (the loader warns when a file uses it).
    session_defaults: SessionDefaults = Field(
        default_factory=SessionDefaults, validation_alias=AliasChoices("session_defaults", "duplex_session"))
    playback_pacing: PlaybackPacing = Field(default_factory=PlaybackPacing)
    # Intra-op threads of the torch work in the server process (torch-backend stages such as
    # code2wav, the thinker-to-talker bridge); unset keeps torch's default, one per core. Set it
    # when vLLM stages own the cores (`cpu_cores`): torch's spare threads then wait for cores
    # that are busy, and every operator waits for its slowest thread.
    server_torch_threads: PositiveInt | None = None
    ray: RayCluster | None = None  # None: every stage in the server process
    connectors: list[ConnectorConfig] = Field(default_factory=list)
    stages: list[StageConfig] = Field(min_length=1)

    def stage(self, stage_id: int) -> StageConfig:
        for stage in self.stages:
            if stage.stage_id == stage_id:
                return stage
        raise KeyError(f"no stage with stage_id {stage_id}")

    def stage_by_role(self, role: str) -> StageConfig:
        for stage in self.stages:
            if stage.role == role:
                return stage
        raise KeyError(f"no stage with role {role!r}")
