"""`lynx tune --hardware a,b --gpus 4,8`: which GPUs, how many. The per-type tables, then the fastest configuration
and the one with the fewest GPU-hours per iteration across all types and counts, checked against the tables it
printed (read back from the output: the best row of each)."""

from __future__ import annotations

import re

import pytest

from conftest import lynx
from lynx_planner import tune
from lynx_planner.io import InputError


@pytest.mark.parametrize("text,counts", [("64", [64]), ("128,32,64,64", [32, 64, 128]), ("32-256", [32, 64, 128, 256]),
                                         ("24-100", [32, 64]), (" 8 ", [8])])
def test_gpu_counts(text, counts):
    assert tune.gpu_counts(text) == counts


@pytest.mark.parametrize("text", ["0", "a", "100-50", "3-3", ",".join(str(n) for n in range(1, 18)), "8,-1", ""])
def test_bad_gpu_counts_name_the_option(text):
    with pytest.raises(InputError, match="--gpus"):
        tune.gpu_counts(text)


def _tables(output: str) -> list[tuple[int, str, float, float]]:
    """(GPUs, hardware, iteration s, GiB) of each table's first (best) row."""
    found = []
    for m in re.finditer(r"on (\d+) x (\S+), global batch.*?\n(?:.*\n){3}\s+1\s+(.*)", output):
        cells = m.group(3).split()
        found.append((int(m.group(1)), m.group(2).rstrip(","), float(cells[-4]), float(cells[-3])))
    return found


def test_tune_across_types_and_counts_ends_with_two_verdicts():
    r = lynx("tune", "gpt-1.3b", "--hardware", "a100-80g-nvlink,h100-80g-nvlink", "--gpus", "4,8",
             "--global-batch", "16", "--time-limit", "30", "--top", "2")
    assert r.exit_code == 0, r.output
    best = _tables(r.output)
    assert sorted((n, hw) for n, hw, _, _ in best) == [(4, "a100-80g-nvlink"), (4, "h100-80g-nvlink"),
                                                      (8, "a100-80g-nvlink"), (8, "h100-80g-nvlink")]
    fastest = min(best, key=lambda b: (b[2], b[0]))
    cheapest = min(best, key=lambda b: (b[0] * b[2], b[2]))
    lines = {ln.split(":")[0]: ln for ln in r.output.splitlines() if ln.startswith(("fastest:", "fewest GPU-hours:"))}
    for key, (n, hw, secs, gib) in (("fastest", fastest), ("fewest GPU-hours", cheapest)):
        line = lines[key]
        assert line.startswith(f"{key}: {n} x {hw},") and f"{secs:.3f} s/iteration" in line
        assert f"peak {gib:.2f} GiB" in line
        headroom = float(re.search(r"headroom ([0-9.]+) GiB", line).group(1))
        assert headroom == pytest.approx(75.80 - gib, abs=0.011)  # the default limit of both 80 GB types
        hours = float(re.search(r"([0-9.e+-]+) GPU-hours/iteration", line).group(1))
        assert hours == pytest.approx(n * secs / 3600, rel=0.01)


def test_one_type_one_count_prints_no_verdict_and_out_needs_one_of_each(tmp_path):
    r = lynx("tune", "gpt-1.3b", "--gpus", "8", "--global-batch", "16", "--time-limit", "30", "--top", "1")
    assert r.exit_code == 0 and "fastest:" not in r.output
    r = lynx("tune", "gpt-1.3b", "--gpus", "4,8", "--global-batch", "16", "--out", tmp_path / "best")
    assert r.exit_code == 2 and "--out" in r.output and not (tmp_path / "best").exists()


def test_a_count_that_cannot_split_the_batch_is_a_note_not_the_end():
    r = lynx("tune", "gpt-1.3b", "--gpus", "8,1024", "--global-batch", "4", "--time-limit", "30", "--top", "1")
    assert r.exit_code == 0, r.output
    assert "note: 1024 x" in r.output and "fastest: 8 x" in r.output
