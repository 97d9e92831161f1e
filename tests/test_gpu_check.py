"""benchmarks/gpu_check.py refuses clearly where there is no CUDA device (CI never depends on a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_cuda_it_says_why_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _script().main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "nothing to offload to" in err


def test_calibrate_on_cpu_has_no_host_link(monkeypatch):
    from lynx_planner import calibrate, offload

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert offload.measure_link() is None
    assert calibrate._host_link(1) == {"host_link": "none"}
