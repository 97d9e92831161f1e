"""Live bytes before and after each F, B and W of one `lynx validate` iteration, per rank: where a split backward's
memory goes (docs/zero-bubble-memory.md). Runs the plans that `validate_plans.py --schedule zero-bubble` wrote.

    python benchmarks/zero_bubble_trace.py                       # the plans in benchmarks/out/validate
    python benchmarks/zero_bubble_trace.py --keep-output-graph   # as before: the last stage's output view keeps its graph
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from lynx_planner import validate

MODEL = Path(__file__).with_name("validate_gpt.py")
MIB = 1 << 20


def _worker(rank: int, log_dir: str, keep_output_graph: bool, *args) -> None:
    """validate's worker, with each stage action logged as (action, micro-batch, live MiB before, after, peak)."""
    from torch.distributed.pipelining import stage as stage_module

    from lynx_planner.profiler import memory
    from lynx_planner.runtime import pipelining

    current: list = [None]
    log: list = []

    class Logged(memory.LiveBytes):  # validate's tracker, remembered so that the actions can read it
        def __enter__(self):
            current[0] = self
            return super().__enter__()

    memory.LiveBytes = Logged
    if keep_output_graph:
        pipelining._drop_output_graph = lambda stage, micro_batch: None
    base = stage_module._PipelineStageBase
    for name, tag in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"), ("backward_weight_one_chunk", "W")):
        def logged(self, mb, *a, _fn=getattr(base, name), _tag=tag, **k):
            t = current[0]
            before = t.live if t else 0
            out = _fn(self, mb, *a, **k)
            if t:
                log.append((_tag, mb, before / MIB, t.live / MIB, t.peak / MIB))
            return out
        setattr(base, name, logged)
    try:
        validate._worker(rank, *args)
    finally:
        Path(log_dir, f"rank{rank}.json").write_text(json.dumps(log))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", default="none,full", help="plans in --dir to run")
    parser.add_argument("--dir", type=Path, default=Path("benchmarks/out/validate"))
    parser.add_argument("--keep-output-graph", action="store_true",
                        help="leave torch's last-stage output as torch does (a view keeps its graph until the step ends)")
    args = parser.parse_args()
    names = args.plans.split(",")
    with tempfile.TemporaryDirectory() as log_dir:
        # the spawned workers (mp.spawn pickles the worker by name) read these from the environment they inherit
        os.environ["LYNX_TRACE_DIR"] = log_dir
        os.environ["LYNX_TRACE_KEEP_OUTPUT_GRAPH"] = "1" if args.keep_output_graph else ""
        original, validate._worker = validate._worker, _spawned
        try:
            runs = validate.run([str(args.dir / f"{n}.json") for n in names], str(MODEL), repeats=1, warmup=0)
        finally:
            validate._worker = original
        print(validate.table([validate.summary(r) for r in runs]))
        for rank in range(len(runs[0].stages[0])):
            print(f"rank {rank}: action micro-batch  live MiB before -> after  (peak so far); plans in order "
                  f"{', '.join(names)}")
            for tag, mb, before, after, peak in json.loads(Path(log_dir, f"rank{rank}.json").read_text()):
                print(f"  {tag} {mb}  {before:8.2f} -> {after:8.2f}  ({peak:.2f})")


def _spawned(rank: int, *args) -> None:
    _worker(rank, os.environ["LYNX_TRACE_DIR"], bool(os.environ["LYNX_TRACE_KEEP_OUTPUT_GRAPH"]), *args)


if __name__ == "__main__":
    main()
