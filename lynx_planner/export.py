"""`lynx export`: a plan as the launch settings of a training framework.

Megatron-LM: the layout flags, the stage split (`--decoder-first/last-pipeline-num-layers` when only the end stages
differ, else `--pipeline-model-parallel-layout`) and the nearest recomputation flags: Megatron's built-in choices
(none, selective core attention, full, block N) simulated on the plan's split, the fastest that fits the plan's
limit, with what Megatron cannot express and what that costs. torchtitan: the parallelism, training and
activation-checkpoint settings, and where to call `lynx_planner.apply_plan`: for torchtitan 0.3 the command-line
overrides its ConfigManager parses (`--module … --config …` plus `--section.key value`), for 0.2.2 a TOML job file.

Checked against Megatron-LM core_v0.20.0 (NVIDIA/Megatron-LM d98e8a6, 2026-08-22; Python >= 3.12): every flag is
one its parser accepts (tests/data/megatron_flags.txt, read from megatron/training/arguments.py and the config
dataclasses it exposes, e.g. TransformerConfig's --recompute-*, by scripts/megatron_flags.py) and torchtitan
v0.2.2 (torchtitan/config/job_config.py: [parallelism], [training], [activation_checkpoint]) and torchtitan 0.3.0
(torchtitan/config/manager.py ConfigManager; tests/test_export.py parses the export with it when it is installed).
The Hugging Face families' Megatron exports build the profiled model (exports/megatron_model.py) and pass megatron-core
0.19.2's own parser, validate_args and TransformerConfig build with its layout check (tests/test_megatron_export.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from . import evaluate as ev
from . import offload, parallel, schedules
from .exports import architecture, megatron_model, torchtitan_model
from .exports.layout import layout_flag, layout_notes, roles, split_flags, virtual_flags  # noqa: F401 (export.*)
from .io import InputError
from .schema import Plan, Profile

MEGATRON_VERSION = "Megatron-LM core_v0.20.0"  # tests/data/megatron_flags.txt; it needs Python >= 3.12
TORCHTITAN_VERSION = "torchtitan 0.3.0"
TORCHTITAN_02_VERSION = "torchtitan v0.2.2"
# torchtitan's config_registry functions of lynx's catalog Llamas (`--module llama3 --config NAME`); the export finds
# any model's by its shape (exports/torchtitan_model.py FLAVORS)
TORCHTITAN_CONFIGS = {"llama3-8b": ("llama3", "llama3_8b"), "llama3-70b": ("llama3", "llama3_70b"),
                      "llama3-405b": ("llama3", "llama3_405b")}


@dataclass
class MegatronChoice:
    name: str  # none | selective | full | block N
    flags: list[str]
    iteration_time_s: float
    peak_memory_bytes: int
    fits: bool


@dataclass
class MegatronExport:
    flags: list[str]  # layout and split
    recompute: MegatronChoice | None  # the nearest built-in recomputation that fits (None: none fits)
    choices: list[MegatronChoice]
    not_expressible: list[str] = field(default_factory=list)
    plan_time_s: float = 0.0


def _repeated(profile: Profile) -> str:
    from .solvers.partition import repeated_block

    return repeated_block(profile)


def _megatron_choices(profile: Profile, bounds: list[int], limit: int) -> list[MegatronChoice]:
    """Megatron's built-in recomputation on the plan's split, each simulated."""
    from .solvers import megatron

    n = len(profile.layers)
    layers = set(megatron.transformer_layers(profile))  # every layer type, as Megatron recomputes them
    per_stage = max(sum(bounds[s] <= i < bounds[s + 1] for i in layers) for s in range(len(bounds) - 1))
    options = [("none", [], [ev.none_policy(profile, i) for i in range(n)]),
               ("selective", ["--recompute-granularity selective", "--recompute-modules core_attn"],
                [megatron._selective(profile, i) if i in layers else ev.none_policy(profile, i)
                 for i in range(n)]),
               ("full", ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"],
                megatron._block(profile, bounds, per_stage))]
    for k in range(1, per_stage):
        options.append((f"block {k}", ["--recompute-granularity full", "--recompute-method block",
                                       f"--recompute-num-layers {k}"], megatron._block(profile, bounds, k)))
    out = []
    for name, flags, pols in options:
        e = ev.evaluate(profile, ev.stage_plans(profile, bounds, pols), ideal=False)
        out.append(MegatronChoice(name, flags, e.predicted.iteration_time_s, e.peak_bytes, e.fits(limit)))
    return out


def _not_expressible(plan: Plan, profile: Profile) -> list[str]:
    rep = _repeated(profile)
    pols = [p for st in plan.stages for p in st.policies if p.block == rep]
    modes = Counter(p.mode for p in pols for _ in range(*p.layers))
    placements = Counter(p.at for p in pols for _ in range(*p.layers) if p.recompute)
    notes = []
    selective = [p for p in pols if p.mode == "selective"]
    if selective:
        kinds = {tuple(p.keep) for p in selective}
        notes.append(f"{modes['selective']} layers keep op-level subsets ({len(kinds)} distinct keep sets); Megatron's "
                     "selective granularity only drops whole modules (core_attn, mlp, layernorm, ...)")
    if modes["selective"] and (modes["full"] or modes["none"]):
        notes.append("the plan mixes per-layer modes (" + ", ".join(f"{v} {k}" for k, v in sorted(modes.items()))
                     + "); Megatron applies one granularity to all layers")
    early = {k: v for k, v in placements.items() if k != "on_demand"}
    if early:
        notes.append("recomputation released early (" + ", ".join(f"{v} layers {k}" for k, v in sorted(early.items()))
                     + ") runs hidden in communication waits; Megatron recomputes on demand, on the critical path")
    return notes


def megatron(plan: Plan, profile: Profile, where: str = "profile") -> MegatronExport:
    """Megatron-LM's flags for the plan; an InputError naming `where` (the profile) for a model or layout Megatron
    cannot build (exports/megatron_model.py)."""
    par = profile.parallel
    spec = megatron_model.spec_of(profile, where)
    bounds = [st.layers[0] for st in plan.stages] + [plan.stages[-1].layers[1]]
    flags = [f"--tensor-model-parallel-size {par.tp}", f"--pipeline-model-parallel-size {par.pp}"]
    if par.sequence_parallel:
        flags.append("--sequence-parallel")
    ep_flags, ep_notes = megatron_model.expert_flags(spec, par)
    flags += ep_flags
    # (further parallel dimensions' flags go here, one function per dimension)
    flags += [f"--micro-batch-size {par.micro_batch_size}",
              f"--global-batch-size {par.micro_batch_size * par.num_microbatches * par.dp}",
              f"--seq-length {par.seq_len}"]
    cfg = profile.model.config
    kernel_notes: list[str] = []
    if spec is not None and spec.family != "gpt":
        flags += megatron_model.model_flags(spec, par, where)
        flags.append(f"--max-position-embeddings {par.seq_len}")
        kernel, kernel_notes = megatron_model.kernel_flags(profile)
        flags += kernel
    elif {"num_layers", "hidden", "heads"} <= set(cfg):  # the Megatron GPT: Megatron's default model
        flags += [f"--num-layers {cfg['num_layers']}", f"--hidden-size {cfg['hidden']}",
                  f"--num-attention-heads {cfg['heads']}"]
        if "ffn_hidden" in cfg:
            flags.append(f"--ffn-hidden-size {cfg['ffn_hidden']}")
        flags.append(f"--max-position-embeddings {par.seq_len}")
    flags += parallel.megatron_flags(par)[0]  # FSDP and CP (lynx_planner/parallel)
    if par.dp > 1:
        if par.overlap_grad_reduce:
            flags.append("--overlap-grad-reduce")
        if par.distributed_optimizer:
            flags.append("--use-distributed-optimizer")
            if par.overlap_param_gather:
                flags.append("--overlap-param-gather")
    if par.tp_comm_overlap:
        flags.append("--tp-comm-overlap")
    if not par.overlap_p2p_comm and par.virtual_stages > 1:  # Megatron's 1F1B never overlaps its sends
        flags.append("--no-overlap-p2p-communication")
    if not par.gradient_accumulation_fusion:
        flags.append("--no-gradient-accumulation-fusion")
    flags += precision_flags(profile)
    if profile.attention == "flash":
        flags.append(f"--attention-backend {megatron_model.attention_backend(spec)}")
    flags += virtual_flags(profile, bounds) if par.virtual_stages > 1 else split_flags(profile, bounds)
    choices = _megatron_choices(profile, bounds, limit := plan.memory_limit_bytes)
    choices += [MegatronChoice(**c) for c in [offload.megatron_choice(plan, profile, bounds, limit)] if c]
    fitting = [c for c in choices if c.fits]
    best = min(fitting, key=lambda c: c.iteration_time_s) if fitting else None
    best = next((c for c in fitting if c.name.startswith("offload ")), best)  # an offload plan: its nearest offload
    notes = (_not_expressible(plan, profile) + layout_notes(profile, bounds) + kernel_notes + ep_notes
             + parallel.megatron_flags(par)[1] + offload.export_notes(plan, profile))
    if par.tp > 1 and not par.async_tp_allreduce:
        notes.append("the profile all-reduces TP input gradients after each GEMM's backward (async_tp_allreduce "
                     "false, Megatron before 2021-09); Megatron-LM now always runs them beside the weight gradient")
    if par.dp > 1 and not par.contiguous_grad_buffers:
        notes.append("the profile copies gradients to DDP buckets and back (contiguous_grad_buffers false, Megatron "
                     "before 2021-08); Megatron-LM's DDP now always reduces them in place")
    if par.dp > 1 and not par.grad_reduce_in_fp32:
        notes.append("the profile reduces 16-bit gradients (grad_reduce_in_fp32 false): Megatron does so only under "
                     "--fp16 without --accumulate-allreduce-grads-in-fp32; these flags train in bf16 (fp32 grads)")
    if par.pp > 1 and par.virtual_stages == 1 and par.overlap_p2p_comm:
        notes.append("the profile runs its pipeline sends beside the compute (overlap_p2p_comm true, as torch's "
                     "schedules do); Megatron-LM's non-interleaved 1F1B always blocks on them: profile with "
                     "--no-overlap-p2p-communication to price Megatron's run")
    if schedules.get(par.schedule).splits_backward:
        notes.append(f"the plan is for the {par.schedule} schedule ({schedules.get(par.schedule).torch_class}); "
                     "Megatron-LM has no zero-bubble schedule: these flags run "
                     + ("interleaved 1F1B" if par.virtual_stages > 1 else "1F1B")
                     + ", whose bubbles and memory differ from the plan's (its times above are simulated as planned)")
    return MegatronExport(flags, best, choices, notes, plan.predicted.iteration_time_s)


def precision_flags(profile: Profile) -> list[str]:
    """Megatron's precision flag for the profile's training precision: bf16 or fp16 weights, or autocast to one of
    them over fp32 weights (Megatron's mixed precision: fp32 main weights in the optimizer), is --bf16 / --fp16;
    an analytic profile is bf16; plain fp32 training is Megatron's default, no flag."""
    half = profile.autocast or (profile.dtype if profile.dtype else "bf16")
    return {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(half, [])


def _catalog_name(name: str) -> list[str]:
    """torchtitan's module names for the catalog GPT's (Llama-style) layers."""
    return {"embedding": ["tok_embeddings"], "lm_head": ["norm", "output"]}.get(name, [name])


def torchtitan(plan: Plan, profile: Profile) -> dict[str, dict]:
    """The TOML sections of a torchtitan job config."""
    par = profile.parallel
    catalog = profile.model.source == "catalog"
    parts = [[n for name in st.layer_names for n in (_catalog_name(name) if catalog else [name])]
             for st in plan.stages]
    parallelism = {"tensor_parallel_degree": par.tp, "pipeline_parallel_degree": par.pp,
                   "pipeline_parallel_schedule": schedules.get(par.schedule).torchtitan,
                   "pipeline_parallel_microbatch_size": par.micro_batch_size}
    parallelism |= parallel.torchtitan_settings(par)  # DP sharding and CP degrees (lynx_planner/parallel)
    if par.pp > 1:
        parallelism["module_fqns_per_model_part"] = parts
    training = {"local_batch_size": par.micro_batch_size * par.num_microbatches,
                "global_batch_size": par.micro_batch_size * par.num_microbatches * par.dp, "seq_len": par.seq_len}
    return {"parallelism": parallelism, "training": training, "activation_checkpoint": {"mode": "none"}}


def toml(sections: dict[str, dict]) -> str:
    import json

    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


TORCHTITAN_APPLY = '''\
# module_fqns_per_model_part uses torchtitan's Llama names (tok_embeddings, layers.N, norm, output) for catalog
# models; a model file's own module paths otherwise.
# torchtitan/models/llama3/infra/parallelize.py, in parallelize_llama(model, parallel_dims, job_config):
# after apply_tp(...) and before apply_compile / apply_fsdp (activation_checkpoint.mode = "none", so apply_ac
# does not wrap the layers first). Under PP this runs once per model part; the part keeps the model's
# module paths (layers.N), which the plan's layer_names refer to, and they tell the part's stage: with virtual
# stages a rank holds several parts (chunks rank, rank + pp, ...), and the plan's stages are those chunks.
import lynx_planner
from lynx_planner.runtime.names import stage_of
stage = stage_of(model, "plan.json", "torchtitan-0.2")
model = lynx_planner.apply_plan(model, "plan.json", stage=stage, names="torchtitan-0.2")
'''


def _torchtitan_config(plan: Plan, profile: Profile, where: str) -> tuple[tuple[str, str], list[str]]:
    """torchtitan's (module, config) that builds the profiled model (exports/torchtitan_model.py), or an InputError:
    torchtitan has no Megatron GPT, and a measured profile's model is unknown: the Llama 3 debug model is named for it
    only where its depth is the plan's (torchtitan's pipeline split would otherwise drop layers)."""
    spec = architecture.spec_of(profile, where)
    if spec is not None:
        architecture.unknown_fields(profile, torchtitan_model.HANDLED, torchtitan_model.MOE_HANDLED, "torchtitan",
                                    where)
        module, config, notes = torchtitan_model.config_of(spec, where)
        return (module, config), notes
    if profile.model.source == "catalog":  # the catalog GPTs: every other catalog model records its architecture
        raise InputError(f"{where}: field model: {profile.model.name} is a Megatron GPT (LayerNorm, GeLU, learned "
                         "positions), which torchtitan 0.3 does not build; not exporting a different model (export "
                         "it --to megatron)")
    decoders = sum(r == "t" for r in roles(profile))
    if decoders != torchtitan_model.DEBUG_LAYERS:
        raise InputError(f"{where}: field layers: lynx does not know which torchtitan config builds this "
                         f"model-file model of {decoders} decoder layers; torchtitan's Llama 3 debug model has "
                         f"{torchtitan_model.DEBUG_LAYERS}, and its pipeline split would drop the layers the plan "
                         "does not list: export a plan of a profile of torchtitan's model as its config builds it")
    return torchtitan_model.DEBUG, [f"the profile is of a model file: --module/--config name torchtitan's "
                                    f"Llama 3 debug model ({decoders} layers, as the profile's); give your model's"]


def torchtitan_args(plan: Plan, profile: Profile, where: str = "profile") -> tuple[list[list[str]], list[str]]:
    """(arguments, one option per line, and notes) for torchtitan 0.3's ConfigManager: `--module M --config C` and `--section.key value`
    overrides of the 0.2.2 settings above; AC off (`activation-checkpoint:none`): the plan is applied by
    `lynx_planner.integrations.torchtitan.LynxAC` (TORCHTITAN_HOOK)."""
    from .layouts import CONVENTIONS, plan_convention, rename

    sections = torchtitan(plan, profile)
    module_config, notes = _torchtitan_config(plan, profile, where)
    if profile.model.architecture is not None and profile.kernels != "torchtitan":
        notes.append(f"the profile prices {profile.kernels} kernels{' in fp8' if profile.fp8 else ''}, not "
                     "torchtitan's modules: profile with --kernels torchtitan (Llama) for its block's saved tensors")
    args = [["--module", module_config[0]], ["--config", module_config[1]]]
    parallelism = dict(sections["parallelism"])
    spec = architecture.spec_of(profile, where)
    ep, ep_notes = torchtitan_model.expert_parallel(spec, profile.parallel.tp, profile.parallel.ep,
                                                    parallelism.get("data_parallel_shard_degree", 1), where)
    parallelism |= ep
    notes += ep_notes
    if "module_fqns_per_model_part" in parallelism:
        source = plan_convention(plan)
        if source is not None:  # 0.3.0 names the last model part lm_head (0.2.2: output)
            parts = [rename(st.layer_names, source, CONVENTIONS["torchtitan"]) for st in plan.stages]
        else:
            parts = parallelism["module_fqns_per_model_part"]
            notes.append("the plan's layer names follow no known layout: module_fqns_per_model_part lists them as "
                         "they are")
        parallelism["module_fqns_per_model_part"] = parts
    for section in ("parallelism", "training"):
        for key, value in (parallelism if section == "parallelism" else sections[section]).items():
            if isinstance(value, list):
                args.append([f"--{section}.{key}", *(",".join(part) for part in value)])
            else:
                args.append([f"--{section}.{key}", str(value)])
    if profile.parallel.pp > 1:
        args.append(["--training.disable_cuda_graphs"])  # torchtitan 0.3.0's pipeline schedules need it
    args.append(["activation-checkpoint:none"])
    return args, notes + offload.export_notes(plan, profile, to="torchtitan")


TORCHTITAN_HOOK = '''\
# Apply the plan where torchtitan applies AC: a config_registry function (your module, e.g. lynx_configs.py)
# that sets the lynx policy, then run with --module lynx_configs --config <its name> (and no activation-checkpoint:
# the policy is in the config). torchtitan's parallelize calls LynxAC.apply(model) once per pipeline model part;
# the plan's stage is found from the layers the part holds, layer and op names are mapped onto torchtitan's.
from torchtitan.models.{module}.config_registry import {config}
from lynx_planner.integrations.torchtitan import with_lynx_plan

def {config}_lynx():
    return with_lynx_plan({config}(), plan="{plan}")
'''
