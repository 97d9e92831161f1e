"""HEU's search time against the size of a block and the depth of a pipeline (issue 15).

CPU seconds (time.process_time) of one HEU search (`solvers.solve`, block caches cleared first, as in a fresh
`lynx plan`) at the memory limit halfway between full recomputation and none, median of REPEATS:

  * per model file (the dense zoo tests/zoo_models.py and the MoE zoo tests/moe_models.py, in fp32, bf16 and bf16
    autocast, profiled on this CPU; profiles cached in CACHE): ops of the largest block, repeats folded, candidates,
    the frontier's bound, HEU's time and, with --opt, OPT's time, status and HEU's simulated time above OPT's;
  * a synthetic MoE layer (tests/moe_models.synthetic_moe_block) with 8, 64 and 256 experts;
  * depth: gpt-175b TP 8 at PP x M, and the 13B PCIe README case (halfway, and at the README's 16.1875 GiB);
  * catalog: every modern catalog model (dense, MoE with EP, MLA) at a layout it trains with, interleaved where its
    depth allows (CATALOG), on h100-80g-nvlink; `search_time_s` is what `lynx plan` reports (wall, whole search).

    python benchmarks/heu_scaling.py [--repeats 3] [--opt] [--zoo dense,moe,synthetic,depth,catalog] [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from lynx_planner import solvers  # noqa: E402
from lynx_planner.analytic import gpt_profile  # noqa: E402
from lynx_planner.io import dumps  # noqa: E402
from lynx_planner.models.catalog import MODELS  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.schema import ParallelConfig, Profile  # noqa: E402
from lynx_planner.solvers import candidates, repeats  # noqa: E402

PRECISIONS = {"fp32": ("fp32", None), "bf16": ("bf16", None), "bf16-autocast": ("fp32", "bf16")}
DEPTH = [(8, 64), (16, 128), (32, 256), (48, 384)]
README_LIMIT = 16 * 2**30 + 3 * 2**26  # 16.1875 GiB, the README's `lynx plan` of the 13B PCIe case
# model: (tp, pp, dp, ep, virtual stages, micro-batches) on h100-80g-nvlink, seq 4096 (DeepSeek's and Qwen3-MoE's
# 61 and 94 layers: even splits under interleaving need pp x v dividing the layers, as Megatron's does not require)
CATALOG = {
    "llama3-8b": (2, 4, 8, 1, 2, 32), "llama3-70b": (8, 4, 4, 1, 5, 32), "llama3-405b": (8, 16, 4, 1, 2, 64),
    "qwen2.5-72b": (8, 4, 4, 1, 5, 32), "qwen3-32b": (4, 4, 8, 1, 4, 32),
    "mixtral-8x7b": (2, 4, 8, 8, 2, 32), "mixtral-8x22b": (4, 8, 8, 8, 1, 32),
    "qwen3-235b-a22b": (4, 8, 16, 16, 1, 64), "deepseek-v3": (1, 16, 64, 64, 1, 64),
}


def catalog_profile(name: str) -> tuple[Profile, str]:
    """The catalog model's analytic profile on its real layout (CATALOG), on h100-80g-nvlink, and the layout's label."""
    from lynx_planner.analytic import profile as analytic_profile

    tp, pp, dp, ep, v, m = CATALOG[name]
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, seq_len=4096, num_microbatches=m, sequence_parallel=tp > 1,
                         distributed_optimizer=True, schedule="interleaved-1f1b" if v > 1 else "1f1b",
                         virtual_stages=v)
    layout = f"tp{tp} pp{pp}" + (f" v{v}" if v > 1 else "") + f" dp{dp}" + (f" ep{ep}" if ep > 1 else "")
    return analytic_profile(MODELS[name], par, HARDWARE["h100-80g-nvlink"]), f"{layout} M{m}"


def named_case(name: str) -> tuple[Profile, int]:
    """`13b`: the README's 13B PCIe case at its 16.1875 GiB; else a catalog layout half way between full
    recomputation's peak and none's (the cases heu_phases.py and heu_instructions.py take)."""
    if name == "13b":
        pcie = Path(__file__).resolve().parent.parent / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json"
        return Profile.model_validate_json(pcie.read_text()), README_LIMIT
    prof, _ = catalog_profile(name)
    return prof, _limit(prof, 0.5)


def _limit(prof: Profile, frac: float = 0.5) -> int:
    full, none = (solvers.solve(prof, a, 1 << 62).evaluation.peak_bytes for a in ("full", "none"))
    return int(full + frac * (none - full))


def timed(prof: Profile, algo: str, limit: int, repeats_: int, time_limit: float | None = None):
    cpu, got = [], None
    for _ in range(repeats_):
        candidates.reset_caches()
        t0 = time.process_time()
        got = solvers.solve(prof, algo, limit, time_limit)
        cpu.append(time.process_time() - t0)
    return statistics.median(cpu), min(cpu), max(cpu), got


def _profile(model_file: str, name: str, precision: str, cache: Path) -> Profile:
    path = cache / f"{Path(model_file).stem}-{name}-{precision}.json"
    if not path.exists():
        from lynx_planner.profiler import profile_model_file

        dtype, autocast = PRECISIONS[precision]
        prof = profile_model_file(model_file, parallel=ParallelConfig(pp=1, num_microbatches=2),
                                  hardware=HARDWARE["a100-80g-nvlink"], overrides={"name": name}, dtype=dtype,
                                  autocast=autocast, progress=False, warn=lambda m: None)
        path.write_text(dumps(prof))
    return Profile.model_validate_json(path.read_text())


def row(label: str, prof: Profile, args, frac: float = 0.5) -> str:
    limit = _limit(prof, frac)
    block = max(prof.blocks.values(), key=lambda b: len(b.ops))
    found = repeats.find(block)
    med, lo, hi, heu = timed(prof, "heu", limit, args.repeats)
    bound = heu.solver.candidates
    fr = candidates.frontier(block)
    line = (f"| {label} | {len(block.ops)} | {sum(k for _, _, k in found) or '-'} | {len(fr.candidates)} | "
            f"{'exact' if bound is None else ('grouped' if bound.groups else '') + (f' eps {bound.eps:g}' if bound.eps else '')} | "
            f"{med:.3f} ({lo:.3f}-{hi:.3f}) |")
    if args.opt:
        o_med, _, _, opt = timed(prof, "opt", limit, 1, args.time_limit)
        h, o = heu.evaluation.predicted.iteration_time_s, opt.evaluation.predicted.iteration_time_s
        line += f" {o_med:.2f} | {opt.solver.status} | {100 * (h - o) / o:+.2f}% |"
    return line


def header(args) -> str:
    cols = "| case | ops (largest block) | copies folded | candidates | candidates are | HEU CPU s median (min-max) |"
    sep = "|---|---:|---:|---:|---|---:|"
    if args.opt:
        cols += " OPT CPU s | OPT status | HEU vs OPT |"
        sep += "---:|---|---:|"
    return cols + "\n" + sep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--opt", action="store_true", help="also time OPT and compare HEU's simulated time with it")
    ap.add_argument("--time-limit", type=float, default=60.0, help="OPT's time limit")
    ap.add_argument("--zoo", default="dense,moe,synthetic,depth")
    ap.add_argument("--cache", default="/tmp/heu-scaling-profiles")
    ap.add_argument("--models", default=",".join(CATALOG), help="catalog models of --zoo catalog")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    parts = args.zoo.split(",")
    print(f"load average {os.getloadavg()[0]:.2f}; CPU seconds of one search, median of {args.repeats}")
    print(header(args))
    if "dense" in parts:
        from zoo_models import NAMES

        for name in NAMES:
            for prec in PRECISIONS:
                print(row(f"{name} {prec}", _profile(str(ROOT / "tests/zoo_models.py"), name, prec, cache), args),
                      flush=True)
    if "moe" in parts:
        from moe_models import NAMES as MOE

        for name in MOE:
            for prec in PRECISIONS:
                print(row(f"{name} {prec}", _profile(str(ROOT / "tests/moe_models.py"), name, prec, cache), args),
                      flush=True)
    if "synthetic" in parts:
        from moe_models import synthetic_moe_profile

        for e in (8, 64, 256):
            print(row(f"synthetic MoE, {e} experts", synthetic_moe_profile(e), args), flush=True)
    if "depth" in parts:
        print("\n| depth case | layers per stage | HEU CPU s median (min-max) | iteration s |\n|---|---:|---:|---:|")
        cases = [(f"gpt-175b tp8 pp{pp} M{m}", gpt_profile(
            MODELS["gpt-175b"], ParallelConfig(tp=8, pp=pp, num_microbatches=m, sequence_parallel=True),
            HARDWARE["a100-80g-nvlink"], "flash", 0.0), 0.3) for pp, m in DEPTH]
        pcie = Profile.model_validate_json((ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
        cases.append(("gpt-13b pcie tp4 pp4 M16 (README)", pcie, 0.5))
        # the README's worked example plans at 16.1875 GiB, nearer full recomputation's need: a harder search
        cases.append(("gpt-13b pcie tp4 pp4 M16 at 16.1875GiB (README's lynx plan)", pcie, README_LIMIT))
        for label, prof, frac in cases:
            limit = frac if isinstance(frac, int) else _limit(prof, frac)
            med, lo, hi, heu = timed(prof, "heu", limit, args.repeats)
            print(f"| {label} | {len(prof.layers) / prof.parallel.pp:.1f} | {med:.3f} ({lo:.3f}-{hi:.3f}) | "
                  f"{heu.evaluation.predicted.iteration_time_s:.4f} |", flush=True)
    if "catalog" in parts:
        print("\n| catalog model | layout | HEU CPU s median (min-max) | search_time_s | iteration s |\n"
              "|---|---|---:|---:|---:|")
        for name in args.models.split(","):
            prof, layout = catalog_profile(name)
            med, lo, hi, heu = timed(prof, "heu", _limit(prof, 0.5), args.repeats)
            print(f"| {name} | {layout} | {med:.3f} ({lo:.3f}-{hi:.3f}) | {heu.solver.search_time_s:.3f} | "
                  f"{heu.evaluation.predicted.iteration_time_s:.4f} |", flush=True)


if __name__ == "__main__":
    main()
