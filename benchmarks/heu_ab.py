"""HEU's search time, this tree against another (e.g. main before a change), in one process: both trees'
`lynx_planner` packages are loaded side by side (copied under two names) and their searches alternate, so a loaded
machine slows both alike (separate processes minutes apart compare the load as much as the code).

CPU seconds (time.process_time) of one HEU search, block caches cleared first (as a fresh `lynx plan` pays), min and
median of REPEATS per tree, and whether both found the same iteration time, per case: the README's 13B case at its
16.1875 GiB (`13b`), the same halfway between full recomputation and none (`13b-half`), and the catalog layouts of
benchmarks/heu_scaling.py (CATALOG) halfway.

    python benchmarks/heu_ab.py --base ../lynx-planner-before [--cases 13b,llama3-405b] [--repeats 6]
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import heu_scaling as hs  # noqa: E402


def _load(tree: Path, name: str, into: Path):
    shutil.copytree(tree / "lynx_planner", into / name)  # its imports are relative: it runs under any name
    return name


def _case(pkg: str, which: str):
    def m(mod: str):
        return importlib.import_module(f"{pkg}.{mod}")
    solvers, schema = m("solvers"), m("schema")
    if which.startswith("13b"):
        prof = schema.Profile.model_validate_json(
            (ROOT / "profiles/gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16.json").read_text())
        if which == "13b":
            return prof, hs.README_LIMIT
    else:
        tp, pp, dp, ep, v, mb = hs.CATALOG[which]
        par = schema.ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, seq_len=4096, num_microbatches=mb,
                                    sequence_parallel=tp > 1, distributed_optimizer=True,
                                    schedule="interleaved-1f1b" if v > 1 else "1f1b", virtual_stages=v)
        prof = m("analytic").profile(m("models.catalog").MODELS[which], par,
                                     m("models.hardware").HARDWARE["h100-80g-nvlink"])
    full, none = (solvers.solve(prof, a, 1 << 62).evaluation.peak_bytes for a in ("full", "none"))
    return prof, int(full + 0.5 * (none - full))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other tree (a checkout holding lynx_planner/)")
    ap.add_argument("--cases", default="13b,13b-half," + ",".join(hs.CATALOG))
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        pkgs = (_load(Path(args.base), "lynx_base", Path(tmp)), _load(ROOT, "lynx_this", Path(tmp)))
        print(f"load average {os.getloadavg()[0]:.2f}; CPU s of one HEU search, {args.repeats} alternating repeats: "
              "min / median")
        print("| case | base | this tree | median change | same iteration time |\n|---|---:|---:|---:|---|")
        for which in args.cases.split(","):
            setup = {p: _case(p, which) for p in pkgs}
            cpu: dict[str, list[float]] = {p: [] for p in pkgs}
            times: dict[str, set[float]] = {p: set() for p in pkgs}
            for r in range(args.repeats + 1):  # the first round warms both up, untimed
                for p in pkgs if r % 2 else pkgs[::-1]:
                    importlib.import_module(f"{p}.solvers.candidates").reset_caches()
                    t0 = time.process_time()
                    got = importlib.import_module(f"{p}.solvers").solve(setup[p][0], "heu", setup[p][1])
                    if r:
                        cpu[p].append(time.process_time() - t0)
                    times[p].add(got.evaluation.predicted.iteration_time_s)
            a, b = cpu[pkgs[0]], cpu[pkgs[1]]
            print(f"| {which} | {min(a):.3f} / {statistics.median(a):.3f} | {min(b):.3f} / {statistics.median(b):.3f} "
                  f"| {100 * (statistics.median(b) / statistics.median(a) - 1):+.0f}% | "
                  f"{'yes' if times[pkgs[0]] == times[pkgs[1]] else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
