"""Where FSDP's all-gathers are exposed (issue 26): HEU against Megatron's full / selective / block and torchtitan's
op-level selective AC, and how much of each one's recomputation hides in FSDP's windows.

    python benchmarks/fsdp_exposed.py                       # Llama 3 70B, HSDP across nodes, limits 30 and 22 GiB
    python benchmarks/fsdp_exposed.py --seq-len 2048 --limit 20GiB

The case (docs/guide.md's worked example): Llama 3 70B on 256 H100s, TP 8 inside a node with sequence parallelism,
FSDP shard groups of 8 ranks one per node (one NIC each), 4 replicas, 4 micro-batches of one sequence. Each layer's
all-gather over one NIC lasts about as long as its forward, its all-gather plus reduce-scatter longer than its
backward: the compute stream waits on the DP stream, and recomputation can run there.

Columns: the simulated iteration, its speed against full recomputation, the peak, the recomputation's work (seconds
of compute, per rank and iteration), what of it is exposed and hidden, and of the hidden what runs in FSDP's windows
(the DP stream's waits: side-stream work overlapping them in the trace, and on-demand recomputation beside a wait,
which the simulator credits there) and in TP's (side-stream work beside the TP collectives). `tt-op-sac` is torchtitan's save list as a keep set on every decoder layer
(published_runs.TT_SAC_KEEP); of it, lynx can keep only the tensors some backward reads (the q and down projections'
outputs are recomputed, not cached as torchtitan's checkpoint cache does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lynx_planner import simulator, streams
from lynx_planner.build import build_profile
from lynx_planner.evaluate import evaluate, layer_policy, none_policy, stage_plans
from lynx_planner.io import parse_size
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.schema import ParallelConfig, Profile
from lynx_planner.solvers import Infeasible, solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_runs import TT_SAC_KEEP  # noqa: E402

ALGOS = ("heu", "full", "selective", "block", "tt-op-sac")
COLLECTIVES = ("all-gather", "reduce-scatter", "optimizer", "DP")  # DP-stream events that are transfers, not waits


def hsdp_70b(seq_len: int = 8192) -> Profile:
    par = ParallelConfig(tp=8, sequence_parallel=True, dp=32, fsdp=True, hsdp_shard_size=8, seq_len=seq_len,
                         num_microbatches=4)
    return build_profile("llama3-70b", par, HARDWARE["h100-80g-nvlink"])


def tt_op_sac(profile: Profile) -> list:
    keep = frozenset(TT_SAC_KEEP)
    return [layer_policy(profile, i, keep) if "DecoderLayer" in layer.block else none_policy(profile, i)
            for i, layer in enumerate(profile.layers)]


def _overlap(spans: list[tuple[float, float]], windows: list[tuple[float, float]]) -> float:
    """Total length of `spans` lying inside `windows` (each list of (start, end); windows disjoint)."""
    windows = sorted(windows)
    total = 0.0
    for a, b in spans:
        for c, d in windows:
            if c >= b:
                break
            total += max(0.0, min(b, d) - max(a, c))
    return total


def hidden_by_window(profile: Profile, policies: list, ev) -> tuple[float, float]:
    """(in FSDP's windows, in TP's) seconds of hidden recomputation work (one pipeline stage: pp 1). FSDP's: on-demand
    recomputation beside a DP-stream wait (the simulator credits it there) and side-stream work overlapping the DP
    stream's waits in the trace; TP's: side-stream work overlapping the TP collectives the compute stream waits for."""
    runs = simulator.stage_runs(profile, 0, len(profile.layers), policies)
    beside = profile.parallel.num_microbatches * sum(r.rec_beside for r in runs)
    trace = ev.sim.trace
    side = [(e["ts"], e["ts"] + e["dur"]) for e in trace if e["tid"] == streams.SIDE]
    dp_waits = [(e["ts"], e["ts"] + e["dur"]) for e in trace
                if e["tid"] == streams.DP and not e["name"].startswith(COLLECTIVES)]
    tp = [(e["ts"], e["ts"] + e["dur"]) for e in trace if e["tid"] == streams.TP]
    side_wall = sum(b - a for a, b in side)
    if side_wall <= 0:
        return beside, 0.0
    work_per_wall = (ev.predicted.stages[0].hidden_recompute_s - beside) / side_wall  # the side stream's slowdown
    return beside + _overlap(side, dp_waits) * work_per_wall, _overlap(side, tp) * work_per_wall


def row(profile: Profile, algo: str, limit: int) -> dict:
    if algo == "tt-op-sac":
        policies = tt_op_sac(profile)
        stages = stage_plans(profile, [0, len(profile.layers)], policies)
    else:
        try:
            strategy = solve(profile, algo, limit)
        except Infeasible:  # shown with what it needs, as lynx compare does
            strategy = solve(profile, algo, 1 << 62)
        stages = strategy.stages
        policies = [p for st in stages for p in st.policies]
    ev = evaluate(profile, stages, trace=True)
    st = ev.predicted.stages[0]
    return {"algo": algo, "iteration_s": ev.predicted.iteration_time_s, "peak_gib": ev.peak_bytes / 2**30,
            "fits": ev.fits(limit), "exposed_s": st.exposed_recompute_s, "hidden_s": st.hidden_recompute_s,
            **dict(zip(("in_fsdp_s", "in_tp_s"), hidden_by_window(profile, policies, ev)))}


def table(profile: Profile, limit: int, algos: tuple[str, ...] = ALGOS) -> list[dict]:
    rows = [row(profile, a, limit) for a in algos]
    full = next((r["iteration_s"] for r in rows if r["algo"] == "full" and r["fits"]), None)
    for r in rows:
        r["vs_full"] = full / r["iteration_s"] if full and r["fits"] else None
    return rows


def show(rows: list[dict], limit: int) -> str:
    lines = [f"memory limit {limit / 2**30:.2f} GiB",
             f"  {'algo':10s} {'iter s':>8s} {'vs full':>8s} {'peak GiB':>9s} {'fits':>5s} {'recompute':>10s} "
             f"{'exposed':>9s} {'hidden':>9s} {'in FSDP':>9s} {'in TP':>9s}"]
    for r in rows:
        vs = f"{r['vs_full']:.3f}x" if r["vs_full"] else "-"
        lines.append(f"  {r['algo']:10s} {r['iteration_s']:8.4f} {vs:>8s} {r['peak_gib']:9.2f} "
                     f"{'yes' if r['fits'] else 'no':>5s} {1e3 * (r['exposed_s'] + r['hidden_s']):8.1f}ms "
                     f"{1e3 * r['exposed_s']:7.1f}ms {1e3 * r['hidden_s']:7.1f}ms {1e3 * r['in_fsdp_s']:7.1f}ms {1e3 * r['in_tp_s']:7.1f}ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--limit", action="append", help="memory limits (default 30GiB and 22GiB)")
    ap.add_argument("--algos", default=",".join(ALGOS))
    args = ap.parse_args(argv)
    prof = hsdp_70b(args.seq_len)
    print(f"Llama 3 70B, 256 H100s: tp 8 (SP) in a node, HSDP shard groups of 8 across nodes x 4 replicas, "
          f"seq {args.seq_len}, 4 micro-batches")
    for lim in args.limit or ["30GiB", "22GiB"]:
        limit = parse_size(lim, "--limit")
        print(show(table(prof, limit, tuple(args.algos.split(","))), limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
