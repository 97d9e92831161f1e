"""profile_model_file on the example GPT: structure, layers, static bytes, tensor parallelism, measurement."""

from pathlib import Path

import pytest

from lynx_planner import analytic, policy
from lynx_planner.models.catalog import GPTConfig
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.profiler import profile_model_file
from lynx_planner.schema import ParallelConfig

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "gpt_model.py")
H100 = HARDWARE["h100-80g-nvlink"]


def profile(**kw):
    par = ParallelConfig(seq_len=64, micro_batch_size=2, **kw.pop("par", {}))
    return profile_model_file(EXAMPLE, parallel=par, hardware=H100, progress=False, **kw)


def test_structure_and_layers():
    p = profile()
    assert [layer.name for layer in p.layers] == ["embed", "layers.0", "layers.1", "layers.2", "layers.3",
                                                   "norm", "head"]
    assert [layer.block for layer in p.layers][:2] == ["Embedding", "GPTBlock"]
    assert set(p.blocks) == {"Embedding", "GPTBlock", "LayerNorm", "Linear"}
    assert p.method == "analytic" and p.model.source == EXAMPLE and p.attention == "flash"
    assert sum(layer.params for layer in p.layers) == p.model.params
    assert all(layer.static_bytes == layer.params * 18 for layer in p.layers)
    for block in p.blocks.values():
        info = policy.analyse(block)
        assert policy.closure(info, policy.none_keep(info)) == ()
    gpt = p.blocks["GPTBlock"]
    assert all(op.fwd_s > 0 for op in gpt.ops) and sum(op.bwd_s for op in gpt.ops) > sum(op.fwd_s for op in gpt.ops)


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_matches_analytic(sp):
    par = {"tp": 2, "sequence_parallel": sp}
    got = policy.analyse(profile(par=par, dtype="bf16").blocks["GPTBlock"])  # the analytic profile is bf16
    ref = policy.analyse(analytic.gpt_layer_block(GPTConfig("t", 4, 128, 4), ParallelConfig(
        seq_len=64, micro_batch_size=2, **par), H100, "flash", 0.0))
    assert [op.id for op in got.block.ops if op.kind == "collective"] == [
        op.id for op in ref.block.ops if op.kind == "collective"]
    assert got.units == ref.units
    for unit in ref.units:
        if "layer_norm" not in unit:
            assert got.unit_bytes[unit] == ref.unit_bytes[unit], unit
    assert got.block.input_bytes == ref.block.input_bytes


def test_tensor_parallel_params():
    full, split = profile(), profile(par={"tp": 2})
    layer, layer2 = full.layers[1], split.layers[1]
    h = 128
    assert layer.params - layer2.params == (3 * h * h + 3 * h + h * h + 8 * h * h + 4 * h) // 2


def test_measure_on_cpu():
    p = profile(method="measure")
    assert p.method == "measure"
    assert sum(op.fwd_s for op in p.blocks["GPTBlock"].ops) > 0
    assert sum(op.bwd_s for op in p.blocks["GPTBlock"].ops) > 0


def test_measure_split_backward_under_zero_bubble_only():
    zb = profile(method="measure", par={"pp": 2, "schedule": "zero-bubble"})
    assert zb.blocks["GPTBlock"].split_backward > 0  # B + W over the whole backward, measured (noisy: tiny model)
    assert zb.blocks["Embedding"].split_backward is None  # token input: torch runs its backward whole
    assert profile(method="measure", par={"pp": 2}).blocks["GPTBlock"].split_backward is None  # 1F1B: whole


def test_split_backward_chains_a_stage_of_instances():
    """W re-reads what B left behind; the span is a stage's layers, so instances run chained (one input, timed
    once per chained backward: a chain of 3 takes about 3 times one instance's backward)."""
    import torch

    from lynx_planner.profiler import timing

    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(3)]
    x = torch.randn(8, 64)
    calls = []
    for b in blocks:
        b.register_forward_hook(lambda m, i, o: calls.append(m))
    assert timing.measure_split([(b, (x,), {}) for b in blocks], chain=3, runs=1, warmup=0) > 0
    assert calls[1:4] == blocks  # after the probe of the first: each instance once per chained forward, in order
    calls.clear()
    head = torch.nn.Linear(64, 10)  # output not shaped as the input: measured alone
    head.register_forward_hook(lambda m, i, o: calls.append(m))
    assert timing.measure_split([(head, (x,), {})] * 3, chain=3, runs=1, warmup=0) > 0
    assert len(calls) == 1 + 2  # the probe, then one per timed backward (whole, split)


def test_one_cpu_thread_times_kernels_by_cpu_time():
    """A shared machine's waits for a CPU stay out of a one-thread profile, as validate measures the run; several
    threads or a GPU: wall time."""
    import time

    from lynx_planner.profiler.recorder import op_clock

    assert op_clock(cuda=False, threads=1) is time.thread_time
    assert op_clock(cuda=False, threads=2) is time.perf_counter
    assert op_clock(cuda=True, threads=1) is time.perf_counter


def test_op_times_scaled_to_the_plain_block():
    from lynx_planner.profiler.timing import scaled_to_block

    times = {"a": (1.0, 2.0), "b": (3.0, 6.0)}
    scaled = scaled_to_block(times, (2.0, 16.0))  # forward half, backward twice the ops' sums
    assert scaled == {"a": (0.5, 4.0), "b": (1.5, 12.0)}
    assert scaled_to_block({"a": (0.0, 2.0)}, (1.0, 0.0)) == {"a": (0.0, 2.0)}  # nothing to scale: unchanged


def test_measured_profile_sums_to_the_plain_block(monkeypatch):
    import lynx_planner.profiler.profile as profile_module

    monkeypatch.setattr(profile_module, "measure_block", lambda *a, **k: (1.0, 2.0))
    gpt = profile(method="measure").blocks["GPTBlock"]
    assert sum(op.fwd_s for op in gpt.ops) == pytest.approx(1.0)
    assert sum(op.bwd_s for op in gpt.ops) == pytest.approx(2.0)
