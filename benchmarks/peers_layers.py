"""One compiled decoder layer of the peers' Llama timed on its own: plain compile, lynx compiled's plan and compile's
partitioner around lynx's kept bytes, each built several times.

    python benchmarks/peers_layers.py [--fraction 0.5] [--builds 2] [--rounds 60] [--layer 2]
                                      [--layers 8] [--hidden 256] [--seq-len 256] [--repeats 5] [--backend inductor]

benchmarks/peers.py times whole training steps, and two builds of one program time a few percent apart there. This
times what a plan changes, a compiled layer's forward and backward: the model of benchmarks/peers.py is built as there
(plain compile; lynx's HEU plan of the compiled profile at `--fraction` of the way from full to no recomputation's
peak; the partitioner at the budget keeping the fewest bytes at or above lynx's, and at the next budget down), each
`--builds` times, and layer `--layer` of every build runs forward (the step's own inputs to that layer, captured once)
and backward (a fixed gradient) in interleaved rounds, in this thread's CPU time. Each build's time is divided by the
same round's lynx build of the same index; the table gives those ratios' median and spread (25th-75th percentile), the
kept bytes of the whole step (peers.kept_bytes) and each build's program (peers.programs: one letter, the same
generated code; '-': not recorded).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peers  # noqa: E402
from lynx_planner import solvers  # noqa: E402


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fraction", type=float, default=0.5, help="the budget: 0 full recomputation's peak, 1 none's")
    ap.add_argument("--builds", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--layer", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5, help="profile: timed runs per block type")
    ap.add_argument("--backend", default="inductor")
    return ap.parse_args(argv)


def layer_inputs(model: torch.nn.Module, index: int, tokens: torch.Tensor) -> tuple[tuple, dict]:
    """The arguments layer `index` receives in a training step of `model`, detached (the hidden states still require
    a gradient)."""
    found: dict = {}

    def grab(_module, args, kwargs):
        found["args"] = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                              for a in args)
        found["kwargs"] = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    handle = model.model.layers[index].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        peers.step(model, tokens)
    finally:
        handle.remove()
    return found["args"], found["kwargs"]


def timed_layer(layer: torch.nn.Module, args: tuple, kwargs: dict, grad: torch.Tensor) -> float:
    t0 = time.thread_time()
    out = layer(*args, **kwargs)
    (out[0] if isinstance(out, tuple) else out).backward(grad)
    elapsed = time.thread_time() - t0
    for p in layer.parameters():
        p.grad = None
    return elapsed


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print(run(args))
    finally:
        torch.set_num_threads(threads)
    return 0


def run(args: argparse.Namespace) -> str:
    load = os.getloadavg()
    profiles = peers.measured_profiles(args)
    from peers_llama import lynx_model

    base, inputs = lynx_model(seq_len=args.seq_len, hidden=args.hidden, layers=args.layers)
    peers.example[:] = inputs
    tokens = inputs[0]
    full, none = peers.peaks_of(profiles)
    plan = solvers.plan(profiles[True], "p.json", "0" * 64, "heu", int(full + args.fraction * (none - full)),
                        compiled=True)
    peers.progress(f"lynx-compiled's plan: {peers.plan_layers(plan)}")
    lynx = peers.build(base, args.backend, plan=plan)
    kept = peers.kept_bytes(lynx, tokens, eager=False)
    budgets = [round(1 - i / 100, 2) for i in range(101)]
    (r, _, _), below = peers.bracket(budgets, lambda b: peers.build(base, args.backend, budget=b), kept)
    kinds = {"lynx-compiled": {"plan": plan}, "plain compile": {}, f"budget {r}": {"budget": r}}
    if below is not None:
        kinds[f"budget {below[0]}"] = {"budget": below[0]}
    models = [(kind, b, peers.build(base, args.backend, **kw)) for b in range(args.builds)
              for kind, kw in kinds.items()]
    kept_of = {kind: peers.kept_bytes(m, tokens, eager=False) for kind, b, m in models if b == 0}
    layer_args, layer_kwargs = layer_inputs(models[0][2], args.layer, tokens)
    grad = torch.randn_like(layer_args[0] if layer_args else layer_kwargs["hidden_states"])
    times: dict[tuple[str, int], list[float]] = {(kind, b): [] for kind, b, _ in models}
    for _, _, m in models:  # warm
        timed_layer(m.model.layers[args.layer], layer_args, layer_kwargs, grad)
    for k in range(args.rounds):
        for kind, b, m in models[k % len(models):] + models[:k % len(models)]:
            times[kind, b].append(timed_layer(m.model.layers[args.layer], layer_args, layer_kwargs, grad))
    lines = [f"peers_layers: layer {args.layer} of HF Llama {args.layers} layers, hidden {args.hidden}, seq "
             f"{args.seq_len}, fp32, 1 thread, {args.backend}, budget {args.fraction:.2f}, {args.builds} builds, "
             f"{args.rounds} interleaved rounds; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after",
             f"{'peer':<16} {'build':>5} {'prog':>4} {'step kept MiB':>13} {'fwd+bwd ms':>10} {'÷ lynx-compiled':>16} "
             f"{'spread':>13}"]
    programs = list(dict.fromkeys(peers.PROGRAM.get(m) for _, _, m in models))
    for kind, b, m in models:
        program = peers.PROGRAM.get(m)
        mark = "-" if program is None else chr(ord("A") + programs.index(program))
        ratios = [a / c for a, c in zip(times[kind, b], times["lynx-compiled", b])]
        q1, med, q3 = peers.quartiles(ratios)
        lines.append(f"{kind:<16} {b:>5} {mark:>4} {kept_of[kind] / 2**20:>13.2f} "
                     f"{statistics.median(times[kind, b]) * 1e3:>10.2f} {med:>16.3f} {f'{q1:.3f}-{q3:.3f}':>13}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
