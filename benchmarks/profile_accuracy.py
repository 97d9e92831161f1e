"""Profile accuracy on CPU: traced saved bytes vs a real forward's live storages, and the sum of per-op measured
times vs the measured block forward and backward (fp32, one thread; runs interleaved so machine noise hits both).

    python benchmarks/profile_accuracy.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from lynx_planner.profiler.loading import load_model_file
from lynx_planner.profiler.memory import saved_bytes_after_forward
from lynx_planner.profiler.structure import capture_layers, name_blocks
from lynx_planner.profiler.timing import measure_block, measure_times
from lynx_planner.profiler.tracing import trace

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CASES = [  # (label, model file, block type, overrides)
    ("reference GPTBlock", "gpt_model.py", "GPTBlock", {"hidden": 512, "seq_len": 512, "dropout": 0.1}),
    ("HF GPT2Block", "hf_gpt2.py", "GPT2Block", {"hidden": 512, "seq_len": 512}),
    ("HF LlamaDecoderLayer", "hf_llama.py", "LlamaDecoderLayer", {"hidden": 512, "seq_len": 512}),
]
ROUNDS = 5


def measure_case(file: str, block: str, overrides: dict) -> dict:
    torch.manual_seed(0)
    model, inputs = load_model_file(EXAMPLES / file, batch_size=2, layers=2, **overrides)
    group = name_blocks(capture_layers(model.train(), inputs))[block]
    first = group[0]
    traced = trace(first.module, first.args, first.kwargs)
    instances = [(s.module, s.args, s.kwargs) for s in group]
    known = {op.id for op in traced.ops}
    op_fwd, op_bwd, blk_fwd, blk_bwd = [], [], [], []
    for _ in range(ROUNDS):
        times = measure_times(instances, known, runs=3, warmup=1)
        op_fwd.append(sum(f for f, _ in times.values()))
        op_bwd.append(sum(b for _, b in times.values()))
        f, b = measure_block(first.module, first.args, first.kwargs, runs=3, warmup=1)
        blk_fwd.append(f)
        blk_bwd.append(b)
    return {"saved": traced.saved_bytes, "real": saved_bytes_after_forward(first.module, first.args, first.kwargs),
            "op_fwd": statistics.median(op_fwd), "blk_fwd": statistics.median(blk_fwd),
            "op_bwd": statistics.median(op_bwd), "blk_bwd": statistics.median(blk_bwd), "ops": len(traced.ops)}


def main() -> int:
    torch.set_num_threads(1)
    header = (f"{'block':22s} {'ops':>4s} {'profile MiB':>11s} {'live MiB':>9s} {'err':>7s}  "
              f"{'Σop fwd ms':>10s} {'fwd ms':>8s} {'err':>6s}  {'Σop bwd ms':>10s} {'bwd ms':>8s} {'err':>6s}")
    print(header)
    worst_bytes = worst_time = 0.0
    for label, file, block, overrides in CASES:
        r = measure_case(file, block, overrides)
        eb = r["saved"] / r["real"] - 1
        ef, ebw = r["op_fwd"] / r["blk_fwd"] - 1, r["op_bwd"] / r["blk_bwd"] - 1
        worst_bytes, worst_time = max(worst_bytes, abs(eb)), max(worst_time, abs(ef), abs(ebw))
        print(f"{label:22s} {r['ops']:4d} {r['saved'] / 2**20:11.2f} {r['real'] / 2**20:9.2f} {eb:+7.2%}  "
              f"{r['op_fwd'] * 1e3:10.2f} {r['blk_fwd'] * 1e3:8.2f} {ef:+6.1%}  "
              f"{r['op_bwd'] * 1e3:10.2f} {r['blk_bwd'] * 1e3:8.2f} {ebw:+6.1%}")
    print(f"worst byte error {worst_bytes:.2%} (target 1%), worst time error {worst_time:.1%} (target 10%)")
    return 0 if worst_bytes <= 0.01 and worst_time <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
