"""The GEMM model against measured CPU profiles: per GEMM of a GPT layer, the measured forward and backward times
(lynx profile --method measure of examples/gpt_model.py, fp32, one thread) beside the analytic model's on this
machine's calibrated hardware, with the shape model (costs.py) and without it (flat efficiency, backward = 2 x
forward, as before).

    python benchmarks/cpu_gemm_model.py                     # calibrates first (about 30 s)
    python benchmarks/cpu_gemm_model.py --hardware cpu.json # a `lynx hardware calibrate` file
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lynx_planner import costs
from lynx_planner.build import build_profile
from lynx_planner.io import load_model
from lynx_planner.schema import Hardware, ParallelConfig

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gpt_model.py"
HIDDEN, HEADS, SEQ, BATCH = 512, 8, 512, 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.hardware:
        hw = load_model(args.hardware, Hardware)
    else:
        from lynx_planner.calibrate import calibrate

        hw = calibrate(threads=1)
    flat = hw.model_copy(update={"gemm_half_dim": None, "gemm_backward_efficiency": None})
    par = ParallelConfig(micro_batch_size=BATCH, seq_len=SEQ)
    prof = build_profile(str(EXAMPLE), par, hw, method="measure", threads=1, repeats=args.repeats,
                         overrides={"hidden": HIDDEN, "heads": HEADS, "seq_len": SEQ, "batch_size": BATCH,
                                    "layers": 2})
    n, h = BATCH * SEQ, HIDDEN
    shapes = {"attn.qkv:addmm#0": (n, h, 3 * h), "attn.proj:addmm#0": (n, h, h), "mlp.fc1:addmm#0": (n, h, 4 * h),
              "mlp.fc2:addmm#0": (n, 4 * h, h)}
    block = next(b for b in prof.blocks.values() if any(op.id in shapes for op in b.ops))
    print(f"hardware: top {hw.peak_flops / 1e9:.1f} GFLOP/s, gemm_half_dim {hw.gemm_half_dim}, "
          f"gemm_backward_efficiency {hw.gemm_backward_efficiency}")
    print(f"{'op':20s} {'fwd meas':>9s} {'model':>7s} {'flat':>7s}   {'bwd meas':>9s} {'model':>7s} {'flat':>7s}  (ms)")
    sums = [0.0] * 6
    for op in block.ops:
        if op.id not in shapes:
            continue
        m, k, nn = shapes[op.id]
        row = [op.fwd_s, costs.gemm_fwd_s(m, k, nn, hw), costs.gemm_fwd_s(m, k, nn, flat),
               op.bwd_s, costs.gemm_bwd_s(m, k, nn, hw), costs.gemm_bwd_s(m, k, nn, flat)]
        sums = [a + b for a, b in zip(sums, row)]
        print(f"{op.id:20s} " + " ".join(f"{x * 1e3:9.2f}" if i % 3 == 0 else f"{x * 1e3:7.2f}"
                                         for i, x in enumerate(row)).replace("   ", "   ", 1))
    print(f"{'sum':20s} " + " ".join(f"{x * 1e3:9.2f}" if i % 3 == 0 else f"{x * 1e3:7.2f}" for i, x in enumerate(sums)))
    print(f"model / measured: forward {sums[1] / sums[0]:.3f} (flat {sums[2] / sums[0]:.3f}), "
          f"backward {sums[4] / sums[3]:.3f} (flat {sums[5] / sums[3]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
