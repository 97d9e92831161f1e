"""Offload against recomputation: the two cases of issue 27's note, every plan judged by the simulator.

    python benchmarks/offload_cases.py [--out DIR] [--microbatches 4]

A. llama3-8b on one H100 (h100-80g-nvlink: PCIe 5.0 x16, 55.6 GB/s measured), seq 8192, micro-batch 1, dp 8 with the
   distributed optimizer (ZeRO-1: the per-GPU view of an 8-GPU data-parallel job), 75.8 GiB usable: memory forces
   recomputation and the host link has spare bandwidth.
B. The link as the bottleneck: the same model at seq 10240 on an H100 in a PCIe 4.0 host (a Gen5 card in a Gen4 server:
   26.8 / 26.2 GB/s D2H / H2D, the catalog's measured Gen4 figures; the hardware file is written under --out). One
   forward window's copies carry far less than the limit asks to leave: the offload plans send what the window
   carries and recompute the rest. The row "heu-offload, Gen5 link" plans the same profile with the H100's PCIe 5.0
   link (55.6 GB/s): it offloads more, so the link, not memory, bounds the offload at Gen4.
For each: OPT with offload (opt-offload), HEU with offload (heu-offload), HEU without, Megatron full and selective
recomputation, Megatron's fine-grained offloading as its docs advise (offload) and torch save_on_cpu (full-offload):
iteration time, peak memory, offloaded GiB per micro-batch, host-link utilisation (the busier direction's copy seconds
over the iteration), "D2H / fwd" (a micro-batch's offloaded bytes over the device-to-host bandwidth, over its
forward's compute seconds: the share of the forward window the copies fill), the backward's stalls on late prefetches
and the exposed recomputation. Each plan is written under --out and passes
`lynx check`. Deterministic: the figures are simulated, not timed (only the search times, not shown, are).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from lynx_planner import solvers
from lynx_planner.evaluate import check
from lynx_planner.io import dumps, file_sha256, load_model, write_atomic
from lynx_planner.schema import Profile

ALGOS = ("opt-offload", "heu-offload", "heu", "full", "selective", "offload", "full-offload")
CASES = {
    "A: llama3-8b, H100 PCIe 5.0, seq 8192": ["llama3-8b", "--hardware", "h100-80g-nvlink", "--seq-len", "8192",
                                              "--dp", "8"],
    "B: llama3-8b, H100 in a PCIe 4.0 host, seq 10240": ["llama3-8b", "--hardware", "{gen4}", "--seq-len", "10240",
                                                         "--dp", "8"],
}
GEN5 = {"host_link": "pcie5-x16", "host_d2h_bytes_per_s": 55.6e9, "host_h2d_bytes_per_s": 55.6e9}


def gen4_h100():
    """The H100 (h100-80g-nvlink) behind a PCIe 4.0 x16 host link: the catalog's Gen4 figures, its own NIC slot."""
    from lynx_planner.models.hardware import HARDWARE, HOST_LINKS

    g4 = HOST_LINKS["a100-80g-pcie"]
    return HARDWARE["h100-80g-nvlink"].model_copy(update={
        "name": "h100-80g-pcie4-host", "host_link": "pcie4-x16", "host_d2h_bytes_per_s": g4.d2h,
        "host_h2d_bytes_per_s": g4.h2d, "host_link_shared_with_nic": False, "pinned_host_bytes": g4.pinned_bytes})


def window_share(profile: Profile, st) -> float:
    """A micro-batch's offloaded bytes over the D2H bandwidth, over its forward compute seconds (pp 1: every layer)."""
    from lynx_planner import offload

    link = offload.rank_link(profile)
    if link is None or not st.offloaded_bytes:
        return 0.0
    fwd = sum(op.fwd_s for l in profile.layers for op in profile.blocks[l.block].ops)
    return (st.offloaded_bytes / link.d2h_bytes_per_s) / fwd


def rows(profile: Profile, path: Path, out: Path, tag: str, extra: dict | None = None) -> list[str]:
    """The table's rows; `extra`: {row name: (profile, algo)} planned besides (not written)."""
    from lynx_planner.models.hardware import default_memory_limit

    sha, limit = file_sha256(path), default_memory_limit(profile.hardware)
    got, profiles = {}, {}
    for algo in ALGOS:
        profiles[algo] = profile
        try:
            plan = solvers.plan(profile, str(path), sha, algo, limit)
        except solvers.Infeasible as e:
            got[algo] = e.needed
            continue
        plan = plan.model_copy(update={"solver": plan.solver.model_copy(update={"search_time_s": 0.0})})
        write_atomic(out / f"{tag}-{algo}.json", dumps(plan))
        assert check(plan, profile) == [], algo
        got[algo] = plan.predicted
    for name, (prof, algo) in (extra or {}).items():
        profiles[name] = prof
        got[name] = solvers.solve(prof, algo, limit).evaluation.predicted
    full = got["full"].iteration_time_s if not isinstance(got["full"], int) else None
    lines = []
    for algo, pred in got.items():
        if isinstance(pred, int):
            lines.append(f"| {algo} | - | - | needs {pred / 2**30:.2f} | no | - | - | - | - | - |")
            continue
        st = max(pred.stages, key=lambda s: s.peak_memory_bytes)
        t = pred.iteration_time_s
        util = max(s.link_busy_s for s in pred.stages) / t
        lines.append(f"| {algo} | {t:.4f} | {full / t:.3f}x | {st.peak_memory_bytes / 2**30:.2f} | yes | "
                     f"{st.offloaded_bytes / 2**30:.2f} | {util:.0%} | {window_share(profiles[algo], st):.0%} | "
                     f"{st.offload_stall_s * 1e3:.1f} | "
                     f"{st.exposed_recompute_s * 1e3:.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/offload"))
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gen4 = args.out / "h100-pcie4-host.json"
    write_atomic(gen4, dumps(gen4_h100()))
    for i, (name, cli) in enumerate(CASES.items()):
        path = args.out / f"case{'AB'[i]}-profile.json"
        cli = [a.replace("{gen4}", str(gen4)) for a in cli]
        subprocess.run([sys.executable, "-c", "from lynx_planner.cli import app; app()", "profile", *cli,
                        "--num-microbatches", str(args.microbatches), "-o", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
        profile = load_model(path, Profile)
        print(f"\n{name}, {args.microbatches} micro-batches, limit 75.80 GiB")
        print("| plan | iteration s | vs full | peak GiB | fits | offloaded GiB/mb | link busy | D2H / fwd | "
              "stall ms | exposed recompute ms |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        extra = None
        if "{gen4}" in CASES[name]:
            fast = profile.model_copy(update={"hardware": profile.hardware.model_copy(update=GEN5)})
            extra = {"heu-offload, Gen5 link": (fast, "heu-offload")}
        for line in rows(profile, path, args.out, f"case{'AB'[i]}", extra):
            print(line)


if __name__ == "__main__":
    main()
