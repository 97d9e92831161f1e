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
