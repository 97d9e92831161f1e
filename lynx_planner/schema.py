"""The data model: hardware, parallel setup, profiles (op graphs of blocks) and plans, as pydantic models.

Every file lynx reads or writes is one of these models serialised as JSON with a `schema_version`.
Times are seconds, sizes bytes, bandwidths bytes per second.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

SCHEMA_VERSION = 1
# Plans that offload (LayerPolicy.offload) are written as version 2, so a lynx that knows only keep and recompute
# refuses them instead of misreading them; every other plan stays version 1, and both load.
PLAN_OFFLOAD_VERSION = 2

# When an offloaded tensor comes back (offload.py): prefetched when backward enters the layer above (Megatron's and
# Transformer Engine's one-layer lookahead; the chunk's top layer: when its backward item starts), or all of a
# micro-batch's at the start of its backward on the chunk (while the rank waits for the gradient).
Reload = Literal["layer_above", "grad_wait"]
RELOADS: tuple[str, ...] = ("layer_above", "grad_wait")

# The block input is not produced by any op of the block; ops refer to it by this name.
BLOCK_INPUT = "input"

# Where a layer's recomputation is released (it then fills idle compute until the layer's backward needs it):
#   on_demand    when backward reaches the layer (Megatron, PyTorch checkpoint): fully on the critical path
#   layer_above  when backward enters the layer above (hidden in that layer's backward TP collectives); for the
#                top layer of a stage this is the wait for the gradient from the next stage
#   grad_wait    when the stage goes idle before this micro-batch's backward (PP receive wait, bubbles)
#   prev_forward at the start of the forward of another micro-batch right before this micro-batch's backward (1F1B
#                steady state; whose TP collectives hide it); on demand where there is none (placements.py)
Placement = Literal["on_demand", "layer_above", "grad_wait", "prev_forward"]
PLACEMENTS: tuple[str, ...] = ("on_demand", "layer_above", "grad_wait", "prev_forward")

# Pipeline schedules (lynx_planner/schedules: one module each); zero-bubble is torch's ScheduleInterleavedZeroBubble.
Schedule = Literal["1f1b", "gpipe", "interleaved-1f1b", "zero-bubble"]

# Training precision: the weights' dtype, and the dtype of autocast over fp32 weights.
Dtype = Literal["fp32", "bf16", "fp16"]
Autocast = Literal["bf16", "fp16"]
# How a decoder layer runs (lynx_planner/kernels): which ops it fuses and which tensors it saves.
Kernels = Literal["hf", "te", "torchtitan"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class Hardware(_Model):
    """One accelerator and its links. Peaks are datasheet values; efficiencies are assumptions to calibrate."""

    name: str
    memory_bytes: PositiveInt
    peak_flops: PositiveFloat = Field(description="dense bf16/fp16 tensor FLOP/s")
    hbm_bytes_per_s: PositiveFloat
    gemm_efficiency: float = Field(gt=0, le=1, description="achieved / peak FLOP/s for large GEMMs")
    attention_efficiency: float = Field(gt=0, le=1, description="achieved / peak FLOP/s for fused attention")
    memory_efficiency: float = Field(gt=0, le=1, description="achieved / peak HBM bandwidth, memory-bound ops")
    gpus_per_node: PositiveInt
    intra_node_bus_bytes_per_s: PositiveFloat = Field(description="collective bus bandwidth (nccl-tests busbw)")
    intra_node_latency_s: float = Field(ge=0)
    inter_node_bus_bytes_per_s: PositiveFloat
    inter_node_latency_s: float = Field(ge=0)
    interference: float = Field(ge=1, description="slowdown of compute running beside a collective")
    notes: str = ""
    # Measured machines (`lynx hardware calibrate`). Left out of the JSON at their defaults, so catalog hardware and
    # the profiles embedding it keep their bytes.
    device: Literal["gpu", "cpu"] = Field("gpu", exclude_if=lambda v: v == "gpu",
                                          description="what one rank computes on")
    backend: str | None = Field(None, exclude_if=lambda v: v is None,
                                description="communication backend the links were measured with (nccl, gloo)")
    threads: PositiveInt | None = Field(None, exclude_if=lambda v: v is None,
                                        description="CPU threads per rank the compute figures were measured with")
    p2p_bytes_per_s: PositiveFloat | None = Field(None, exclude_if=lambda v: v is None,
                                                  description="measured point-to-point bandwidth between two ranks")
    p2p_latency_s: float | None = Field(None, ge=0, exclude_if=lambda v: v is None,
                                        description="measured point-to-point latency")
    # The compute curve and the memory reserve (costs.py, docs/accuracy.md). Left out at None: files written before
    # them keep their bytes and their meaning (flat efficiency, backward = 2 x forward, the default reserve).
    gemm_half_dim: float | None = Field(None, ge=0, exclude_if=lambda v: v is None,
                                        description="a GEMM dimension that alone halves gemm_efficiency (costs.py)")
    gemm_backward_efficiency: float | None = Field(
        None, gt=0, le=1, exclude_if=lambda v: v is None,
        description="efficiency of the backward GEMMs (dgrad, wgrad) relative to the forward's at the same size")
    attention_half_flops: float | None = Field(
        None, ge=0, exclude_if=lambda v: v is None,
        description="FLOPs of one (batch, head) slice of fused attention that runs at half of attention_efficiency")
    nics_per_node: PositiveInt | None = Field(
        None, exclude_if=lambda v: v is None,
        description="network interfaces per node: a collective whose group has several GPUs on each node runs one "
        "ring per NIC across nodes (None: one, the inter-node bus bandwidth whatever the group)")
    memory_reserve_bytes: int | None = Field(
        None, ge=0, exclude_if=lambda v: v is None,
        description="device memory the allocator, libraries and fragmentation hold (None: models.hardware default)")
    # The host link of one GPU, for activation offload (offload.py). Left out at None: the catalog's entry for the
    # hardware's name applies (models/hardware.py HOST_LINKS), and files written before them keep their bytes.
    host_link: str | None = Field(None, exclude_if=lambda v: v is None,
                                  description="the GPU's link to host memory: pcie3-x16, pcie4-x16, pcie5-x16, "
                                  "nvlink-c2c, or 'none' (nothing to offload to: a CPU device)")
    host_d2h_bytes_per_s: PositiveFloat | None = Field(None, exclude_if=lambda v: v is None,
                                                       description="measured device-to-host copy bandwidth, pinned")
    host_h2d_bytes_per_s: PositiveFloat | None = Field(None, exclude_if=lambda v: v is None,
                                                       description="measured host-to-device copy bandwidth, pinned")
    host_link_shared_with_nic: bool | None = Field(
        None, exclude_if=lambda v: v is None,
        description="the GPU's host link also carries its NIC's traffic (a GPU and its NIC behind one PCIe switch)")
    pinned_host_bytes: int | None = Field(None, ge=0, exclude_if=lambda v: v is None,
                                          description="pinned host memory one GPU may fill with offloaded tensors")
    host_copy_latency_s: float | None = Field(
        None, ge=0, exclude_if=lambda v: v is None,
        description="fixed cost of one host copy (one cudaMemcpyAsync: submission and DMA start), beside its bytes")


# Bounds that fail fast instead of exhausting memory or time: far beyond real training setups, and small enough that
# a plan stays quick (the simulator's work and memory grow linearly with micro-batches x layers; HEU plans a 13B,
# pp 4 profile at M = 4096 in about 7 s of CPU and 110 MB; M = 10^7 would need over 100 GB).
MAX_TP, MAX_PP, MAX_DP = 1024, 1024, 1 << 20
MAX_MICRO_BATCH_SIZE, MAX_SEQ_LEN, MAX_MICROBATCHES = 4096, 1 << 20, 4096


class ParallelConfig(_Model):
    tp: PositiveInt = Field(1, le=MAX_TP)
    pp: PositiveInt = Field(1, le=MAX_PP)
    dp: PositiveInt = Field(1, le=MAX_DP)
    micro_batch_size: PositiveInt = Field(1, le=MAX_MICRO_BATCH_SIZE)
    seq_len: PositiveInt = Field(2048, le=MAX_SEQ_LEN)
    num_microbatches: PositiveInt = Field(1, le=MAX_MICROBATCHES)
    sequence_parallel: bool = False
    schedule: Schedule = "1f1b"
    distributed_optimizer: bool = False
    # How a real Megatron run overlaps its communication and orders its ranks (simulator.py, docs/accuracy.md). Left
    # out of the JSON at their defaults, which keep the meaning of profiles written before them.
    overlap_grad_reduce: bool = Field(True, exclude_if=lambda v: v is True,
                                      description="DP gradient reduction overlapped with the last backward")
    overlap_param_gather: bool = Field(False, exclude_if=lambda v: v is False,
                                       description="distributed optimizer: the weight all-gather overlapped with the "
                                       "next iteration's forward (Megatron --overlap-param-gather)")
    tp_comm_overlap: bool = Field(False, exclude_if=lambda v: v is False,
                                  description="TP collectives overlapped with their GEMMs (--tp-comm-overlap)")
    async_tp_allreduce: bool = Field(True, exclude_if=lambda v: v is True,
                                     description="the input gradient's TP collective before a column-parallel GEMM "
                                     "runs beside its weight-gradient GEMM (Megatron's async tensor-model-parallel "
                                     "all-reduce: from 2021-09 on, always since); False: Megatron before it (sc21)")
    grad_reduce_in_fp32: bool = Field(True, exclude_if=lambda v: v is True,
                                      description="DP gradients reduced in fp32 (Megatron's main_grad; forced with "
                                      "--bf16); False: in fp16 (an --fp16 run without "
                                      "--accumulate-allreduce-grads-in-fp32, e.g. the sc21 runs)")
    gradient_accumulation_fusion: bool = Field(True, exclude_if=lambda v: v is True,
                                               description="weight-gradient GEMMs add into the main_grad (Megatron's "
                                               "default since 2022-02); False: a separate add pass per micro-batch")
    contiguous_grad_buffers: bool = Field(True, exclude_if=lambda v: v is True,
                                          description="DP gradients live in flat buffers the reduction works on "
                                          "(Megatron's local DDP default since 2021-08); False: copied to buckets and "
                                          "back (its local DDP before, PyTorch DDP without gradient_as_bucket_view)")
    overlap_p2p_comm: bool = Field(True, exclude_if=lambda v: v is True,
                                   description="pipeline sends run beside compute (Megatron's "
                                   "--overlap-p2p-communication, its default with the interleaved schedule since "
                                   "2023-10); False: Megatron's blocking batched p2p (before 2023, and its 1F1B): "
                                   "the sender waits out its send, interleaved sends a forward's output with the "
                                   "next backward's gradient")
    rank_order: Literal["tp-dp-pp"] | None = Field(
        None, exclude_if=lambda v: v is None,
        description="'tp-dp-pp': Megatron's order (neighbouring stages tp x dp ranks apart, p2p over the p2p link); "
        "None: as profiles before it (p2p over the link spanning tp x pp ranks)")
    optimizer_step: bool = Field(False, exclude_if=lambda v: v is False,
                                 description="the iteration ends with gradient clipping and the Adam step")
    # Virtual pipeline stages (model chunks) per rank: left out of the JSON at 1, so older profiles keep their bytes.
    virtual_stages: PositiveInt = Field(1, le=MAX_PP, exclude_if=lambda v: v == 1,
                                        description="model chunks per pipeline rank (interleaved schedules)")
    # Expert parallelism (MoE): experts sharded over `ep` of the data-parallel ranks, as Megatron carves EP out of DP
    # (expert data parallelism dp / ep). Left out of the JSON at 1, so dense profiles keep their bytes.
    ep: PositiveInt = Field(1, le=MAX_DP, exclude_if=lambda v: v == 1,
                            description="expert-parallel size (MoE models); divides dp and the number of experts")
    # Parameter sharding (lynx_planner/parallel/fsdp.py) and context parallelism (parallel/cp.py). Left out of the
    # JSON at their defaults, so profiles written before them keep their bytes and their meaning.
    fsdp: bool = Field(False, exclude_if=lambda v: v is False,
                       description="parameters, gradients and optimizer state sharded over the data-parallel group "
                       "(FSDP2 / ZeRO-3); per layer all-gathers and reduce-scatters on the DP stream")
    reshard_after_forward: bool = Field(True, exclude_if=lambda v: v is True,
                                        description="FSDP2: free each layer's gathered parameters after its forward "
                                        "(gathered again in backward); False keeps them until its backward")
    hsdp_shard_size: PositiveInt | None = Field(None, le=MAX_DP, exclude_if=lambda v: v is None,
                                                description="HSDP: parameters sharded over groups of this many DP "
                                                "ranks, replicated across dp / hsdp_shard_size groups (None: all dp)")
    cp: PositiveInt = Field(1, le=MAX_TP, exclude_if=lambda v: v == 1,
                            description="context-parallel size: each rank holds seq_len / cp tokens of a sequence; "
                            "attention exchanges K/V chunks around the CP ring")

    @model_validator(mode="after")
    def _check(self) -> ParallelConfig:
        from .schedules import problem

        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        if self.tp_comm_overlap and not self.sequence_parallel:
            raise ValueError("tp_comm_overlap (--tp-comm-overlap) needs sequence_parallel (--sequence-parallel), "
                             "as in Megatron")
        if self.overlap_param_gather and not self.distributed_optimizer:
            raise ValueError("overlap_param_gather (--overlap-param-gather) needs distributed_optimizer "
                             "(--distributed-optimizer)")
        why = problem(self.schedule, self.pp, self.virtual_stages, self.num_microbatches)
        if why:
            raise ValueError(why)
        if self.fsdp and self.distributed_optimizer:
            raise ValueError("fsdp (--fsdp) and distributed_optimizer (--distributed-optimizer) are one or the other: "
                             "FSDP already shards the optimizer state (ZeRO-3), the distributed optimizer only it "
                             "(ZeRO-1)")
        if not self.fsdp and (self.hsdp_shard_size is not None or not self.reshard_after_forward):
            raise ValueError("hsdp_shard_size (--hsdp-shard-size) and reshard_after_forward false "
                             "(--no-reshard-after-forward) need fsdp (--fsdp)")
        if self.hsdp_shard_size is not None and self.dp % self.hsdp_shard_size:
            raise ValueError(f"hsdp_shard_size ({self.hsdp_shard_size}) must divide dp ({self.dp}): HSDP replicates "
                             "shard groups of that size")
        if self.seq_len % self.cp:
            raise ValueError(f"cp ({self.cp}) must divide seq_len ({self.seq_len}): each CP rank holds an equal "
                             "share of the sequence")
        if self.cp > 1 and self.sequence_parallel and (self.seq_len // self.cp) % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide seq_len / cp ({self.seq_len // self.cp}) under "
                             "sequence_parallel")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp}): expert parallelism is carved out of data "
                             "parallelism (Megatron)")
        return self


class Op(_Model):
    """One operator of a block's forward pass, in execution order."""

    id: str = Field(description="stable id: '<module path>:<aten op>#<occurrence>'")
    kind: Literal["compute", "collective"] = "compute"
    fwd_s: float = Field(ge=0, description="forward time; also its recomputation time unless recompute_s is given")
    recompute_s: float | None = Field(None, ge=0, exclude_if=lambda v: v is None,
                                      description="recomputation time where it differs from fwd_s (a compiled "
                                      "profile's fused elementwise ops: what recomputing them adds to the fused "
                                      "backward)")
    bwd_s: float = Field(ge=0, description="backward time (for a collective: its backward communication)")
    bwd_overlap_s: float = Field(
        0.0, ge=0, description="collectives: backward compute that runs beside the backward collective (wgrad)"
    )
    flops: float = Field(0.0, ge=0, description="forward FLOPs")
    out_bytes: int = Field(ge=0, description="bytes of the op's output")
    aux_bytes: int = Field(0, ge=0, description="bytes the op saves for its own backward (masks, statistics)")
    inputs: list[str] = Field(default_factory=list, description="ops whose outputs it reads ('input': block input)")
    saves: list[str] = Field(default_factory=list, description="ops whose outputs its backward needs")
    random: bool = False
    view: bool = False
    inplace: bool = False
    tags: list[str] = Field(default_factory=list, description="e.g. 'core_attn' (Megatron selective recompute)")
    module: str = ""


class Block(_Model):
    """A block type: the op graph shared by all layers that are instances of it."""

    name: str
    input_bytes: int = Field(ge=0, description="bytes of the block input, kept while the micro-batch is in flight")
    output_bytes: int = Field(ge=0, description="bytes of the block output (sent when a stage ends here)")
    ops: list[Op]
    split_backward: float | None = Field(
        None, gt=0, description="measured time of the backward split into input and weight gradients (B then W, as "
        "torch.distributed.pipelining runs a zero-bubble schedule) over the whole backward's; None: not measured (1)")
    record_s: float = Field(
        0.0, ge=0, exclude_if=lambda v: v == 0.0, description="seconds a forward recorded op by op adds: the torch "
        "runtime records a layer whose ops follow the MoE routing at every forward under a policy that keeps some "
        "ops and recomputes others or offloads (policy.records_every_forward); measured by --method measure, else 0 "
        "(not priced)")

    @model_validator(mode="after")
    def _check_graph(self) -> Block:
        seen: set[str] = set()
        for op in self.ops:
            if op.id in seen or op.id == BLOCK_INPUT:
                raise ValueError(f"block {self.name!r}: duplicate or reserved op id {op.id!r}")
            for ref in op.inputs:
                if ref != BLOCK_INPUT and ref not in seen:
                    raise ValueError(f"block {self.name!r}: op {op.id!r} reads {ref!r}, which does not precede it")
            seen.add(op.id)
        for op in self.ops:
            for ref in op.saves:
                if ref != BLOCK_INPUT and ref not in seen:
                    raise ValueError(f"block {self.name!r}: op {op.id!r} saves unknown op {ref!r}")
        return self


class Layer(_Model):
    """One entry of the model's layer sequence."""

    block: str
    name: str = Field(description="module path in the model, e.g. 'layers.3'")
    params: int = Field(ge=0, description="parameters on one rank")
    static_bytes: int = Field(ge=0, description="weights, gradients and optimizer state on one rank")
    # Of `params`, the routed experts' (MoE with expert parallelism): replicated over dp / ep ranks only (expert data
    # parallelism), so reduced and stepped there. Left out of the JSON at 0, so older profiles keep their bytes.
    expert_params: int = Field(0, ge=0, exclude_if=lambda v: v == 0,
                               description="of params, routed-expert parameters (their DP group is dp / ep ranks)")


class ModelInfo(_Model):
    name: str
    source: str = Field(description="'catalog' or the path of the model file")
    params: int = Field(ge=0, description="total parameters of the model")
    config: dict[str, int | float | str | bool] = Field(default_factory=dict)
    # The analytic model description (models/spec.py ModelSpec, its non-default fields), from which exports build the
    # same model in another stack. Left out of the JSON at None: profiles before it, and measured ones, keep their bytes.
    architecture: dict[str, Any] | None = Field(None, exclude_if=lambda v: v is None,
                                                description="the ModelSpec the profile was built from")


Line = tuple[NonNegativeFloat, NonNegativeFloat]  # (seconds, seconds per unit of size) of a measured cost


class LocalRuntime(_Model):
    """What the multi-rank job's runtime costs on the CPU a profile was measured on, besides the layers' compute
    (lynx_planner/profiler/runtime.py measures it with `lynx profile --method measure` on a CPU, for the jobs `lynx
    validate` runs there: a gloo pipeline, or a data-parallel FSDP2 job). A catalog or GPU profile has none; the
    simulator reads it through streams.py."""

    backend: str = Field("gloo", description="the communication backend measured")
    cores: PositiveInt = Field(description="CPU cores of the machine")
    ranks: PositiveInt = Field(description="processes of the job measured (pp, or dp under FSDP)")
    comm_cpu_share: float = Field(ge=0, le=1, description="share of the communication threads' CPU that comes out "
                                  "of the rank's compute: 1 where the job's threads (ranks x (threads + 1)) "
                                  "outnumber the cores, else 0")
    p2p_bytes_per_s: PositiveFloat | None = Field(None, exclude_if=lambda v: v is None,
                                                  description="a pipeline send between two local processes")
    p2p_latency_s: float | None = Field(None, ge=0, exclude_if=lambda v: v is None)
    item_s: list[float] = Field(default_factory=list, exclude_if=lambda v: not v,
                                description="per pipeline rank, its training thread's CPU seconds per forward or "
                                "backward item besides the chunk's layers: torch's stage and schedule, posting and "
                                "waiting on the item's sends and receives, the loss on the last rank (validate's)")
    item_comm_s: list[float] = Field(default_factory=list, exclude_if=lambda v: not v,
                                     description="per pipeline rank, its communication threads' CPU seconds per item")
    grad_scale_s_per_param: float = Field(0.0, ge=0, exclude_if=lambda v: v == 0.0,
                                          description="the pipeline schedule's gradient scaling by 1 / micro-batches "
                                          "at the iteration's end, per parameter of the rank")
    all_gather_cpu_s_per_byte: float = Field(0.0, ge=0, exclude_if=lambda v: v == 0.0,
                                             description="communication threads' CPU per byte gathered (output)")
    reduce_scatter_cpu_s_per_byte: float = Field(0.0, ge=0, exclude_if=lambda v: v == 0.0,
                                                 description="communication threads' CPU per byte reduced (input)")
    # FSDP on this CPU runs in line on the training thread (streams.fsdp_in_line): each measured as a line, [seconds,
    # seconds per unit of size], at the largest unit's size and a sixteenth of it (profiler/runtime.py). Absent from
    # profiles measured before them: their FSDP collectives keep the overlapped model (the CPU per byte above).
    all_gather_wall: Line | None = Field(None, exclude_if=lambda v: v is None,
                                         description="[s, s per output byte]: the wall time of a synchronous gloo "
                                         "all-gather, both ranks starting together (the training thread waits it)")
    reduce_scatter_wall: Line | None = Field(None, exclude_if=lambda v: v is None,
                                             description="[s, s per input byte]: the same for a reduce-scatter")
    fsdp_forward: Line | None = Field(None, exclude_if=lambda v: v is None,
                                      description="[s, s per parameter]: FSDP2's own training-thread CPU per unit "
                                      "forward (hooks, the all-gather's copy-in and copy-out, allocations, the "
                                      "calling thread's part of the collective), over the same units without FSDP2")
    fsdp_backward: Line | None = Field(None, exclude_if=lambda v: v is None,
                                       description="[s, s per parameter]: the same per unit backward, resharded after "
                                       "forward (its gather again; the reduce-scatter's copy-in, the calling thread's "
                                       "part of it, the sharded gradient's accumulation)")
    compute_slowdown: PositiveFloat = Field(1.0, exclude_if=lambda v: v == 1.0,
                                            description="CPU time of the model's forward and backward on every rank "
                                            "at once over on one rank alone: the ranks' kernels slow each other on "
                                            "the shared caches and memory (the blocks were timed alone); 1: none")


class Profile(_Model):
    """What the planner knows about one model in one parallel setup on one kind of hardware."""

    schema_version: Literal[1] = SCHEMA_VERSION
    model: ModelInfo
    parallel: ParallelConfig
    hardware: Hardware
    method: Literal["analytic", "measure"] = "analytic"
    attention: Literal["flash", "math", "none"] = "flash"  # none: a model file without attention (Mamba)
    dropout: float = Field(0.0, ge=0, lt=1)
    blocks: dict[str, Block]
    layers: list[Layer] = Field(min_length=1)
    extra_static_bytes: int = Field(0, ge=0, description="per-rank buffers outside the layers (framework, NCCL)")
    dtype: Dtype | None = Field(None, description="training precision of the weights the profile was made in "
                                "(model files; None: not recorded)")
    autocast: Autocast | None = Field(None, description="autocast dtype of the forward (fp32 weights), or None")
    # How the decoder layers run (lynx_planner/kernels). Left out of the JSON at their defaults (Hugging Face eager
    # kernels, no fp8): profiles before them keep their bytes and meaning.
    kernels: Kernels = Field("hf", exclude_if=lambda v: v == "hf",
                             description="hf: Hugging Face eager modules; te: Megatron-core with Transformer "
                             "Engine; torchtitan: torchtitan's Llama 3 block, eager")
    fp8: bool = Field(False, exclude_if=lambda v: v is False,
                      description="Transformer Engine's fp8 linear layers (their saved inputs in fp8)")
    compiled: bool = Field(False, exclude_if=lambda v: v is False,
                           description="blocks measured as torch.compile runs them (lynx profile --compile): fused "
                           "times, compiled dropout masks")
    runtime: LocalRuntime | None = Field(None, exclude_if=lambda v: v is None,
                                         description="the local job's runtime costs besides the layers (measured "
                                         "CPU profiles of a multi-rank job); None: none modelled")

    @model_validator(mode="after")
    def _check_layers(self) -> Profile:
        for i, layer in enumerate(self.layers):
            if layer.block not in self.blocks:
                raise ValueError(f"layers[{i}].block: unknown block {layer.block!r}")
        if self.parallel.pp > len(self.layers):
            raise ValueError(f"parallel.pp = {self.parallel.pp} exceeds the {len(self.layers)} layers")
        chunks = self.parallel.pp * self.parallel.virtual_stages
        if chunks > len(self.layers):
            raise ValueError(f"parallel.pp x virtual_stages = {chunks} virtual stages exceed the {len(self.layers)} "
                             "layers")
        return self


class LayerPolicy(_Model):
    """What a run of consecutive layers keeps and recomputes, and where the recomputation runs."""

    layers: tuple[int, int] = Field(description="[first, end): global layer indices")
    block: str
    mode: Literal["none", "full", "selective"]
    keep: list[str] = Field(default_factory=list, description="ops whose saved tensors stay from forward to backward")
    recompute: list[str] = Field(default_factory=list, description="ops run again before the backward")
    at: Placement = "on_demand"
    recompute_with: int | None = Field(
        None, description="Megatron uniform chunks: the input is not kept; recomputed on demand when backward "
        "reaches this layer index (the chunk's top layer)")
    # Offload (offload.py): kept ops (or 'input', the block input) whose saved tensors leave for pinned host memory
    # after the layer's forward and come back before its backward. Left out when empty (plans before it).
    offload: list[str] = Field(default_factory=list, exclude_if=lambda v: not v,
                               description="kept ops (or 'input') whose saved tensors are offloaded to the host")
    reload: Reload = Field("layer_above", exclude_if=lambda v: v == "layer_above",
                           description="when offloaded tensors come back: layer_above (backward enters the layer "
                           "above) or grad_wait (the start of the micro-batch's backward on the stage)")


class StagePlan(_Model):
    stage: int = Field(ge=0)
    layers: tuple[int, int] = Field(description="[first, end): global layer indices on this stage")
    layer_names: list[str] = Field(default_factory=list, description="module path of each layer of the stage")
    policies: list[LayerPolicy]


class StagePrediction(_Model):
    stage: int
    peak_memory_bytes: int
    static_bytes: int
    activation_bytes: int
    busy_time_s: float
    exposed_recompute_s: float
    hidden_recompute_s: float
    # Offload (left out at 0: plans before it): bytes one micro-batch sends to the host, the compute stream's waits
    # for late prefetches, the copy engine's busy seconds (each direction's copies, the larger) and the host memory
    # the rank's offloaded tensors fill at their peak.
    offloaded_bytes: int = Field(0, exclude_if=lambda v: v == 0, description="offloaded bytes per micro-batch")
    offload_stall_s: float = Field(0.0, exclude_if=lambda v: v == 0.0,
                                   description="backward waits for prefetches that arrive late (exposed)")
    link_busy_s: float = Field(0.0, exclude_if=lambda v: v == 0.0,
                               description="seconds the busier direction of the host link copies in the iteration")
    host_peak_bytes: int = Field(0, exclude_if=lambda v: v == 0, description="peak pinned host memory held")


class Predicted(_Model):
    iteration_time_s: float
    ideal_iteration_time_s: float
    stages: list[StagePrediction]


class CandidateBound(_Model):
    """How a search's block candidates differ from the exact Pareto sets (solvers/candidates.py)."""

    blocks: list[str] = Field(description="the blocks whose candidates are not their exact Pareto set")
    groups: int = Field(0, description="repeated sub-structures (experts) decided as a group: every copy alike")
    eps: float = Field(0.0, description="each exact Pareto policy (of the grouped block, if grouped) has a candidate "
                       "keeping no more bytes that recomputes at most eps of the block's forward time, and regenerates "
                       "at most eps of its saved bytes, more")


class SolverInfo(_Model):
    name: str
    status: Literal["optimal", "feasible", "heuristic", "time_limit"]
    search_time_s: float
    gap: float | None = None
    bound_s: float | None = Field(None, description="proven lower bound on the objective (MILP solvers)")
    source: str | None = Field(None, description="the search whose plan is returned: 'milp', 'heu' (OPT, AdaPipe "
                               "and Checkmate fall back to HEU's plan where theirs simulates slower or does not fit)")
    candidates: CandidateBound | None = Field(None, exclude_if=lambda v: v is None,
                                              description="set when some block's candidates were bounded or grouped")


class PlanParallel(_Model):
    tp: int
    pp: int
    dp: int
    num_microbatches: int
    schedule: Schedule
    virtual_stages: int = Field(1, exclude_if=lambda v: v == 1, description="model chunks per rank; the plan's "
                                "stages are its virtual stages, chunk c on rank c % pp")
    ep: int = Field(1, exclude_if=lambda v: v == 1, description="expert-parallel size (MoE)")
    fsdp: bool = Field(False, exclude_if=lambda v: v is False, description="FSDP2 / ZeRO-3 parameter sharding")
    reshard_after_forward: bool = Field(True, exclude_if=lambda v: v is True,
                                        description="FSDP2: gathered parameters freed after each layer's forward")
    hsdp_shard_size: int | None = Field(None, exclude_if=lambda v: v is None, description="HSDP shard group size")
    cp: int = Field(1, exclude_if=lambda v: v == 1, description="context-parallel size")


class Plan(_Model):
    schema_version: Literal[1, 2] = SCHEMA_VERSION
    algo: str
    profile_sha256: str
    profile_path: str
    memory_limit_bytes: int
    parallel: PlanParallel
    stages: list[StagePlan]
    predicted: Predicted
    solver: SolverInfo
    dtype: Dtype | None = Field(None, description="the profile's weight precision; apply_plan refuses others")
    autocast: Autocast | None = Field(None, description="the profile's autocast dtype; apply_plan refuses others")
    kernels: Kernels = Field("hf", exclude_if=lambda v: v == "hf", description="the profile's kernels")
    fp8: bool = Field(False, exclude_if=lambda v: v is False, description="the profile's fp8 linear layers")
    compiled: bool = Field(False, exclude_if=lambda v: v is False,
                           description="made for torch.compile (lynx plan --compile): every recomputation runs on "
                           "demand inside the layer's fused backward, and is priced so")
