"""`lynx profile`: build the profile of a model in one parallel setup on one kind of hardware, write it, and print
what was profiled and the peak memory of no and full recomputation."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from ..io import InputError, dumps, format_bytes, write_atomic
from ..schema import ParallelConfig, Profile
from .choices import Method
from .options import check_output, option_errors
from .options import hardware as find_hardware
from .options import threads as check_threads
from .tables import ms
from .terminal import err, out
from .user_code import call_model_file


def run(model: str, output: Path, hardware: str, tp: int, pp: int, dp: int, micro_batch_size: int | None,
        seq_len: int | None, num_microbatches: int | None, sequence_parallel: bool, ep: int, attention, dropout: float,
        method, device, dtype, autocast, threads: int | None, repeats: int | None, schedule, virtual_stages: int,
        distributed_optimizer: bool, overlap_grad_reduce: bool, overlap_param_gather: bool,
        tp_comm_overlap: bool, overlap_p2p_comm: bool, fsdp: bool = False, reshard_after_forward: bool = True,
        hsdp_shard_size: int | None = None, cp: int = 1, kernels=None,
        fp8: bool = False, compile: bool = False) -> None:
    check_output(output, "-o", (model, hardware))
    if not 0.0 <= dropout < 1.0:
        raise InputError(f"--dropout: {dropout} is not in [0, 1)")
    if method is not Method.measure and (threads is not None or repeats is not None):
        raise InputError(f"{'--threads' if threads is not None else '--repeats'} applies to --method measure only")
    check_threads(threads)
    hw = find_hardware(hardware)
    sharding = dict(fsdp=fsdp, reshard_after_forward=reshard_after_forward, hsdp_shard_size=hsdp_shard_size, cp=cp)
    distributed_optimizer = resolve_distributed_optimizer(distributed_optimizer, fsdp)
    try:
        par = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size or 1, seq_len=seq_len or 2048,
                             num_microbatches=num_microbatches or 2 * pp, sequence_parallel=sequence_parallel,
                             schedule=schedule.value, distributed_optimizer=distributed_optimizer, **sharding,
                             overlap_grad_reduce=overlap_grad_reduce, overlap_param_gather=overlap_param_gather,
                             tp_comm_overlap=tp_comm_overlap, overlap_p2p_comm=overlap_p2p_comm,
                             virtual_stages=virtual_stages, ep=ep)
    except ValidationError as e:
        raise InputError(option_errors(e)) from None

    from ..build import build_profile, is_model_file

    if is_model_file(model) and dropout:
        err.print("note: --dropout applies to catalog models; a model file's own dropout modules are profiled")
    overrides = {k: v for k, v in (("batch_size", micro_batch_size), ("seq_len", seq_len)) if v is not None}
    profile = call_model_file(Path(model), "profiling", build_profile, model, par, hw,
                              attention=attention.value if attention else None, dropout=dropout,
                              method=method.value, device=device.value, overrides=overrides,
                              dtype=dtype.value if dtype else None, autocast=autocast.value if autocast else None,
                              threads=threads, repeats=repeats or 5, progress=True,
                              warn=lambda message: err.print(f"warning: {message}"),
                              kernels=kernels.value if kernels else "hf", fp8=fp8, compile=compile)
    write_atomic(output, dumps(profile))
    summary(profile, output)


def sharding(par) -> str:
    """How the data-parallel ranks hold the model, for the summary line."""
    if par.fsdp:
        hsdp = f" (HSDP: shards of {par.hsdp_shard_size})" if par.hsdp_shard_size else ""
        return f", FSDP{hsdp}{'' if par.reshard_after_forward else ' without resharding after forward'}"
    return ", ZeRO-1" if par.distributed_optimizer and par.dp > 1 else ""


def resolve_distributed_optimizer(given: bool | None, fsdp: bool) -> bool:
    """--distributed-optimizer's default: on (ZeRO-1), off under --fsdp, which shards the optimizer state itself;
    both given is one or the other."""
    if given and fsdp:
        raise InputError("--fsdp and --distributed-optimizer are one or the other: FSDP shards parameters, gradients "
                         "and optimizer state (ZeRO-3), the distributed optimizer only the optimizer state (ZeRO-1)")
    return (not fsdp) if given is None else given


def precision(profile: Profile) -> str:
    if profile.autocast:
        return f"fp32 weights, {profile.autocast} autocast"
    return f"{profile.dtype} weights" if profile.dtype else "bf16 (analytic)"


def summary(profile: Profile, path: Path) -> None:
    par, hw = profile.parallel, profile.hardware
    params = profile.model.params
    cfg = profile.model.config
    size = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.1f} M"
    if "device" not in cfg:  # a model description (catalog, config.json, model JSON), profiled analytically
        shapes = f"seq {par.seq_len}"
        how = f"{profile.method} on {hw.name}"
    else:  # what was really run: the device, precision and example inputs of the model file
        shapes = f"inputs {cfg.get('inputs', '?')}"
        how = (f"measured on {cfg.get('device')} ({cfg.get('threads')} thread{'' if cfg.get('threads') == 1 else 's'}, {cfg.get('repeats')} runs, spread "
               f"{cfg.get('spread', 0):.0%}), planned for {hw.name}" if profile.method == "measure" else
               f"traced on {cfg.get('device')}, times analytic for {hw.name}")
    out.print(f"wrote {path}: {profile.model.name} ({size} params, {len(profile.layers)} layers), "
              f"{precision(profile)}, {how} ({format_bytes(hw.memory_bytes)}), tp {par.tp} pp {par.pp} dp {par.dp}"
              f"{f' ep {par.ep}' if par.ep > 1 else ''}{f' cp {par.cp}' if par.cp > 1 else ''}{sharding(par)}, "
              f"micro-batch {par.micro_batch_size} x {par.num_microbatches}, {shapes}, {par.schedule}"
              f"{f' x {par.virtual_stages} virtual stages' if par.virtual_stages > 1 else ''}, "
              f"{profile.attention.replace('none', 'no')} attention, dropout {profile.dropout}"
              + (f", {profile.kernels} kernels" if profile.kernels != "hf" else "") + (", fp8" if profile.fp8 else "")
              + (", compiled (torch.compile, inductor)" if profile.compiled else ""))
    recorded = {name: b.record_s for name, b in profile.blocks.items() if b.record_s}
    if recorded:  # MoE layers the torch runtime records op by op where a plan keeps some ops (docs/composition.md)
        out.print("routed layers recorded at every forward under a selective plan, per forward: " + ", ".join(
            f"{name} {ms(s)} (forward {ms(sum(op.fwd_s for op in profile.blocks[name].ops))})"
            for name, s in recorded.items()) + "; priced in plans")
    try:
        from ..parallel import fsdp
        from ..tune import max_static_bytes

        gathered = fsdp.transient_bytes(profile, list(range(len(profile.layers) // par.pp)))
        out.print(f"static memory per device (largest stage of the even split): {format_bytes(max_static_bytes(profile))}"
                  + (f", of which FSDP's gathered parameters and unsharded gradients {format_bytes(gathered)}"
                     if gathered else ""))
    except Exception:  # a summary line is not worth failing for
        pass
    try:
        from ..solvers import solve

        peaks = {a: solve(profile, a, 2**62).evaluation.peak_bytes for a in ("none", "full")}
        out.print(f"peak memory per device on Megatron's even split: no recomputation {format_bytes(peaks['none'])}, "
                  f"full recomputation {format_bytes(peaks['full'])}")
    except Exception:  # a summary line is not worth failing for
        pass
