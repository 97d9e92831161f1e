"""Offload on one CUDA GPU: the host link, offload beside compute, and an offload plan predicted vs measured.

    python benchmarks/gpu_check.py [--layers 8] [--hidden 1024] [--seq-len 4096] [--batch 2] [--repeats 5]

1. Host link: pinned device-to-host and host-to-device copy bandwidth and the fixed cost of one copy
   (offload.measure_link, CUDA events).
2. Overlap: a bf16 GEMM loop alone, a 1 GiB device-to-host copy alone, then both at once (the copy on its own stream):
   overlap = (GEMMs + copy - both) / the shorter of the two (1: the copy hides entirely behind the GEMMs).
3. A small Llama (examples/hf_llama.py, bf16) profiled by measurement on this GPU, with the host link just measured;
   plans none, full, heu, heu-offload, opt-offload and full-offload under a memory limit 40% of the way from full
   recomputation's peak to none's; each applied with lynx_planner.apply_plan and run for real (micro-batches forward and backward, no
   optimizer step, as the simulated iteration without optimizer_step): predicted vs measured iteration time, and the
   plan's activation peak vs the step's (torch.cuda.max_memory_allocated over what was allocated when the step began:
   parameters and gradients; the check runs no optimizer, so the plan's static bytes are printed apart). The same
   model profiled analytically on the catalog H100 (no measurement) gives a second prediction of none's and full's
   iteration: the analytic cost model against this GPU.
Runs in about 2-4 minutes on an H100 at the defaults. On a machine without CUDA it prints why and exits 2
(`--smoke-cpu` runs step 3 alone on the CPU with host-to-host copies and the H100's catalog link: a test of the
script's code paths whose figures mean nothing; give it small sizes: `--smoke-cpu --layers 2 --hidden 256 --seq-len
256 --batch 1 --microbatches 2 --repeats 1`).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

MODEL = Path(__file__).resolve().parent.parent / "examples" / "hf_llama.py"


def no_cuda() -> str | None:
    """Why this check cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return ("no CUDA device: this check measures a GPU's host link and an offload plan on it; a CPU rank has "
                "nothing to offload to (run it where `torch.cuda.is_available()`)")
    return None


def link(repeats: int) -> dict:
    from lynx_planner.offload import measure_link

    got = measure_link(repeats)
    print(f"host link: device-to-host {got['host_d2h_bytes_per_s'] / 1e9:.1f} GB/s, host-to-device "
          f"{got['host_h2d_bytes_per_s'] / 1e9:.1f} GB/s (pinned, 256 MiB copies), "
          f"{got['host_copy_latency_s'] * 1e6:.1f} us per copy (a 4 KiB copy)")
    return got


def overlap(repeats: int) -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()

    def gemms():
        for _ in range(20):
            a @ a

    def copy():
        with torch.cuda.stream(side):
            host.copy_(dev, non_blocking=True)

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    g, c = timed(gemms), timed(copy)
    both = timed(lambda: (copy(), gemms()))
    frac = (g + c - both) / min(g, c)
    print(f"overlap: GEMMs {g * 1e3:.1f} ms, copy {c * 1e3:.1f} ms, both {both * 1e3:.1f} ms: {frac:.0%} of the "
          "shorter hidden")
    return frac


def plans(args, measured: dict, device: str = "cuda") -> None:
    import torch

    from lynx_planner.profiler.memory import LiveBytes

    from lynx_planner import apply_plan, solvers
    from lynx_planner.io import dumps, file_sha256, write_atomic
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.profiler import profile_model_file
    from lynx_planner.profiler.loading import load_model_file
    from lynx_planner.runtime import runtime_of
    from lynx_planner.schema import ParallelConfig

    cuda = device == "cuda"
    memory = torch.cuda.get_device_properties(0).total_memory if cuda else 80 << 30
    hw = HARDWARE["h100-80g-nvlink"].model_copy(update={
        "name": "local-gpu", "memory_bytes": memory, "host_link": "measured",
        "pinned_host_bytes": 64 << 30, "host_link_shared_with_nic": False, **measured})
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    par = ParallelConfig(micro_batch_size=args.batch, seq_len=args.seq_len, num_microbatches=args.microbatches)
    overrides = {"batch_size": args.batch, "seq_len": args.seq_len, "layers": args.layers, "hidden": args.hidden,
                 "heads": args.hidden // 64, "kv_heads": max(1, args.hidden // 256)}
    profile = profile_model_file(str(MODEL), parallel=par, hardware=hw, method="measure", device=device,
                                 dtype="bf16", overrides=overrides, repeats=args.repeats, progress=False)
    out = Path(tempfile.mkdtemp(prefix="lynx-gpu-check-"))
    write_atomic(out / "profile.json", dumps(profile))
    sha = file_sha256(out / "profile.json")
    full = solvers.solve(profile, "full", 1 << 60).evaluation.peak_bytes
    none = solvers.solve(profile, "none", 1 << 60).evaluation.peak_bytes
    limit = int(full + 0.4 * (none - full))
    print(f"model: Llama, {args.layers} layers, hidden {args.hidden}, {args.batch} x {args.seq_len} tokens, "
          f"{args.microbatches} micro-batches; memory limit {limit / 2**30:.2f} GiB (full {full / 2**30:.2f}, "
          f"none {none / 2**30:.2f})")
    print(f"{'plan':<14}{'predicted s':>12}{'measured s':>12}{'pred act GiB':>13}{'meas act GiB':>13}"
          f"{'meas static':>12}{'offl MiB/mb':>12}"
          f"{'sent MiB/mb':>12}{'stall ms':>10}")
    for algo in ("none", "full", "heu", "heu-offload", "opt-offload", "full-offload"):
        limited = algo in ("heu", "heu-offload", "opt-offload")
        try:
            plan = solvers.plan(profile, "profile.json", sha, algo, limit if limited else 1 << 60, time_limit=20.0)
        except solvers.Infeasible as e:
            print(f"{algo:<14} {e}")
            continue
        write_atomic(out / f"{algo}.json", dumps(plan))
        gc.collect()  # the last plan's model and hooks hold each other: free them before this one's peak counts
        if cuda:
            torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated() if cuda else 0
        model, (tokens,) = load_model_file(str(MODEL), device=device, dtype="bf16", **overrides)
        model.train()
        apply_plan(model, plan)
        runtime = runtime_of(model) if any(p.mode != "none" or p.offload for st in plan.stages
                                           for p in st.policies) else None
        batches = [torch.randint(0, 1024, tokens.shape, device=device) for _ in range(args.microbatches)]

        def step():
            for mb, x in enumerate(batches):
                if runtime is not None:
                    runtime.micro_batch = mb
                out_ = model(x)
                logits = out_.logits if hasattr(out_, "logits") else out_
                if runtime is not None:
                    runtime.trigger(mb, "grad_wait")
                logits.float().square().mean().backward()

        step()  # warm-up: records each layer's program
        sync()
        start = torch.cuda.memory_allocated() if cuda else 0  # parameters and their gradients
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.repeats):
            sync()
            t0 = time.perf_counter()
            if cuda:
                step()
            else:  # the CPU smoke test: live bytes of the step (activations only)
                with LiveBytes() as probe:
                    step()
            sync()
            times.append(time.perf_counter() - t0)
        measured_act = torch.cuda.max_memory_allocated() - start if cuda else probe.peak
        steps = (args.repeats + 1) * args.microbatches
        sent = runtime.offloader.sent_bytes / steps if runtime is not None else 0.0  # what the runtime copied out
        st = plan.predicted.stages[0]
        print(f"{algo:<14}{plan.predicted.iteration_time_s:>12.4f}{sorted(times)[len(times) // 2]:>12.4f}"
              f"{(st.peak_memory_bytes - st.static_bytes) / 2**30:>13.2f}{measured_act / 2**30:>13.2f}"
              f"{(start - base) / 2**30:>12.2f}"
              f"{st.offloaded_bytes / 2**20:>12.1f}{sent / 2**20:>12.1f}{st.offload_stall_s * 1e3:>10.1f}")
        del model, batches, runtime
    print(f"predicted static bytes (parameters, gradients, optimizer states): {st.static_bytes / 2**30:.2f} GiB")
    analytic = profile_model_file(str(MODEL), parallel=par, hardware=HARDWARE["h100-80g-nvlink"], method="analytic",
                                  device=device, dtype="bf16", overrides=overrides, progress=False)
    for algo in ("none", "full"):
        got = solvers.solve(analytic, algo, 1 << 60).evaluation
        print(f"analytic profile (catalog h100-80g-nvlink), {algo}: predicted {got.predicted.iteration_time_s:.4f} s, "
              f"peak {got.peak_bytes / 2**30:.2f} GiB")
    print(f"(plans and profile in {out})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke-cpu", action="store_true", help="step 3 on the CPU, tiny: tests the script only")
    args = parser.parse_args(argv)
    if args.smoke_cpu:
        from lynx_planner.models.hardware import HOST_LINKS

        h100 = HOST_LINKS["h100-80g-nvlink"]
        plans(args, {"host_d2h_bytes_per_s": h100.d2h, "host_h2d_bytes_per_s": h100.h2d}, device="cpu")
        return 0
    why = no_cuda()
    if why is not None:
        print(f"gpu_check: {why}", file=sys.stderr)
        return 2
    measured = link(args.repeats)
    overlap(args.repeats)
    plans(args, measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
