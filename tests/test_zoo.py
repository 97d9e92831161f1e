"""The model zoo end to end (tests/zoo.py): for each model x precision, profile -> HEU plan -> check -> dry run ->
apply_plan -> one training step with gradients bit-identical to the unplanned model, and the activation bytes the
planned forward leaves alive within 2% of the plan's prediction. `python tests/zoo.py` prints the whole matrix."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import zoo  # noqa: E402
from zoo_models import NAMES  # noqa: E402

_cells: dict[tuple[str, str], zoo.Cell] = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo")


def cell(name: str, precision: str, workdir) -> zoo.Cell:
    """Each cell runs once per session; its steps and its bytes are asserted by separate tests."""
    if (name, precision) not in _cells:
        _cells[name, precision] = zoo.run_cell(name, precision, workdir)
    return _cells[name, precision]


CASES = [(n, p) for n in NAMES for p in zoo.PRECISIONS]


@pytest.mark.parametrize("name,precision", CASES)
def test_loop(name, precision, workdir):
    c = cell(name, precision, workdir)
    assert all(c.passed.get(step) for step in zoo.STEPS), c.error


# Under autocast a weight shared by several layers has one cached low-precision copy, held from its first use to its
# last backward, which the per-layer profile counts in each use that keeps it (docs/composition.md).
SHARED_WEIGHT_COPY = pytest.mark.xfail(strict=True, reason="autocast's one cached copy of a shared weight")
BYTES_CASES = [pytest.param(n, p, marks=SHARED_WEIGHT_COPY) if n in ("albert", "shared_layers") and
               p == "bf16-autocast" else (n, p) for n, p in CASES]


@pytest.mark.parametrize("name,precision", BYTES_CASES)
def test_live_bytes_match_the_plan(name, precision, workdir):
    c = cell(name, precision, workdir)
    assert c.bytes_error is not None, c.error
    assert abs(c.bytes_error) <= zoo.BYTES_TOLERANCE, (c.measured_bytes, c.predicted_bytes)
