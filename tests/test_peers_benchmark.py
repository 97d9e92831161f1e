"""benchmarks/peers.py run tiny (2 layers, aot_eager: the partitioner without inductor's C++ build, 2 rounds): every
peer is built, matched and timed; the two ways it measures kept bytes agree on an eager model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

pytest.importorskip("torchtitan", reason="the peers include torchtitan's SelectiveAC and FullAC")

import peers  # noqa: E402
from peers_llama import lynx_model  # noqa: E402


def test_kept_bytes_measured_two_ways_agree_on_an_eager_model():
    """The storages the autograd graph saves (the compiled peers' measure) and the storages the forward leaves alive,
    logits aside (lynx eager's, whose saved tensors its hooks stand in for): one figure for the plain eager model."""
    torch.manual_seed(0)
    model, (tokens,) = lynx_model(seq_len=32, hidden=64, layers=2)
    model.train()
    assert peers.kept_bytes(model, tokens, eager=True) == peers.kept_bytes(model, tokens, eager=False) > 0


def test_peers_smoke_run():
    torch._dynamo.reset()
    args = peers.parse(["--layers", "2", "--hidden", "64", "--seq-len", "32", "--rounds", "2", "--budgets", "1",
                        "--backend", "aot_eager", "--repeats", "1"])
    rows, ilp = peers.run(args)
    torch._dynamo.reset()
    ((fraction, limit, found),) = rows
    assert fraction == 0.5 and limit > 0
    names = [p.name for p in found]
    assert [n for n in names if n != "budget-below"] == ["lynx-compiled", "lynx-twin", "lynx-eager", "budget",
                                                         "sac-torchtitan", "block"]
    ref, twin = found[0], found[1]
    assert twin.kept == ref.kept  # the same plan built again keeps the same bytes
    assert all(len(p.times) == 2 and min(p.times) > 0 for p in found)
    most = {"budget": "activation_memory_budget=1.0", "sac-torchtitan": "2 none", "block": "2 none"}
    for p in found[3:]:  # matched: at least lynx's kept bytes, unless even the knob keeping the most holds less
        if p.name == "budget-below":  # the bracket's other side: the next budget down, below lynx's kept bytes
            assert names.index("budget-below") == names.index("budget") + 1 and p.kept < ref.kept
            continue
        assert p.kept >= ref.kept or p.knob == most[p.name], (p.name, p.knob, p.kept, ref.kept)
    text = peers.table(rows, args, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), ilp)
    assert "lynx-compiled" in text and "sac-ilp:" in text and "budget ÷ lynx-compiled" in text
    assert "resolution: two builds of one program" in text


def test_peers_verdict_tells_a_tie_from_a_loss():
    """A partitioner step faster than lynx's by less than two builds of one program differ is a tie, not a loss;
    faster by more, or lynx keeping more memory, is not met."""
    assert peers.verdict(1.01, True, 0.02) == "met"
    assert peers.verdict(0.99, True, 0.02) == "tie within the resolution"
    assert peers.verdict(0.97, True, 0.02) == "not met"
    assert peers.verdict(1.05, False, 0.02) == "not met"


def _peer(name: str, times: list[float], program: tuple[str, ...] | None = None) -> "peers.Peer":
    return peers.Peer(name, "", torch.nn.Linear(1, 1), 0, eager=True, times=times, program=program)


def test_resolution_is_the_widest_gap_between_peers_of_one_program():
    """lynx-compiled and its twin are one program by construction; two partitioner peers that recorded the same code
    are one too, and their gap (1.10 / 1.00, wider than the twin's 1.02) is the resolution. A peer of another
    program (0.80) sets nothing."""
    rows = [(0.5, 0, [_peer("lynx-compiled", [1.0, 1.0, 1.0]), _peer("lynx-twin", [1.02, 1.02, 1.02]),
                      _peer("budget", [1.0, 1.0, 1.0], ("a", "b")), _peer("block", [1.1, 1.1, 1.1], ("a", "b")),
                      _peer("sac-torchtitan", [0.8, 0.8, 0.8], ("c",))])]
    widest, where = peers.resolution(rows)
    assert widest == pytest.approx(0.10) and where == "block ÷ budget at 0.50"
    assert peers.program_letters(rows[0][2]) == {"lynx-compiled": "A", "lynx-twin": "A", "budget": "B", "block": "B",
                                                 "sac-torchtitan": "C"}


def test_unrecorded_programs_get_no_letter_and_plans_print_what_they_recompute():
    """An eager peer (no generated code recorded) is '-', never lettered alike with another unrecorded one; a plan
    prints its decoder layers run by run, with what each selective run recomputes."""
    from types import SimpleNamespace as NS

    peers_ = [_peer("lynx-compiled", [1.0], ("x",)), _peer("lynx-eager", [1.0]), _peer("block", [1.0])]
    assert peers.program_letters(peers_) == {"lynx-compiled": "A", "lynx-eager": "-", "block": "-"}
    policy = [NS(block="Embedding", layers=(0, 1), mode="none", recompute=[]),
              NS(block="LlamaDecoderLayer", layers=(1, 3), mode="selective", recompute=["mlp:mul#0", ":add#0"]),
              NS(block="LlamaDecoderLayer", layers=(3, 4), mode="none", recompute=[])]
    stage = NS(policies=policy, layers=(0, 4), layer_names=["embed", "m.layers.0", "m.layers.1", "m.layers.2"])
    assert peers.plan_layers(NS(stages=[stage])) == "m.layers.0-1 recompute mlp:mul#0, :add#0; m.layers.2-2 none"


def test_a_partitioner_peer_running_lynxs_program_meets_it():
    """The budget peer that compiled to lynx-compiled's code is lynx's program: met, whatever its builds measured."""
    ref, budget = _peer("lynx-compiled", [1.0], ("x",)), _peer("budget", [0.95], ("x",))
    assert peers.same_program(ref, budget) and not peers.same_program(ref, _peer("budget", [0.95], ("y",)))
    assert peers.verdict(0.95, True, 0.01, same=True) == "met: the same program"
    assert peers.verdict(0.95, True, 0.01) == "not met"


def test_a_compiled_plan_recomputing_nothing_runs_plain_compiles_program():
    """inductor: a plan that recomputes nothing leaves each layer to compile's own partitioner (no checkpoint
    region), so its generated code is plain compile's, byte for byte, as is a second plain build's; the partitioner at
    a lower budget generates other code."""
    from lynx_planner import solvers
    from lynx_planner.models.hardware import HARDWARE
    from lynx_planner.profiler import profile_model_file
    from lynx_planner.schema import ParallelConfig

    torch._dynamo.reset()
    sizes = {"layers": 1, "hidden": 64, "seq_len": 32}
    prof = profile_model_file(peers.MODEL, parallel=ParallelConfig(), hardware=HARDWARE["a100-80g-nvlink"],
                              overrides=sizes, progress=False, warn=lambda m: None)
    none = solvers.plan(prof, "p.json", "0" * 64, "none", 1 << 62, compiled=True)
    base, peers.example[:] = lynx_model(**sizes)
    try:
        built = {name: peers.build(base, "inductor", **kw) for name, kw in
                 (("plain", {}), ("plain again", {}), ("none plan", {"plan": none}), ("budget 0", {"budget": 0.0}))}
    finally:
        torch._dynamo.reset()
    programs = {name: peers.PROGRAM.get(model) for name, model in built.items()}
    assert programs["plain"] and len(programs["plain"]) == 4  # the layer's and the final norm's forward and backward
    assert programs["plain again"] == programs["none plan"] == programs["plain"]
    assert programs["budget 0"] != programs["plain"]


def test_peers_layers_smoke_run():
    """benchmarks/peers_layers.py run tiny (aot_eager, one build, 2 rounds): lynx's plan, plain compile and the
    partitioner around lynx's kept bytes, one compiled layer of each timed."""
    import peers_layers

    torch._dynamo.reset()
    args = peers_layers.parse(["--layers", "2", "--hidden", "64", "--seq-len", "32", "--rounds", "2", "--builds", "1",
                               "--layer", "1", "--repeats", "1", "--backend", "aot_eager"])
    threads = torch.get_num_threads()
    try:
        text = peers_layers.run(args)
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    rows = [line.split() for line in text.splitlines()[2:]]  # from the right: kept MiB, ms, ratio, spread
    assert [" ".join(r[:-6]) for r in rows[:2]] == ["lynx-compiled", "plain compile"]
    assert all(" ".join(r[:-6]).startswith("budget ") for r in rows[2:]) and len(rows) >= 3
    assert rows[0][-2] == "1.000" and all(float(r[-3]) > 0 for r in rows)  # lynx's own ratio; every layer timed
    assert float(rows[1][-4]) >= float(rows[0][-4])  # plain compile keeps at least lynx's bytes
