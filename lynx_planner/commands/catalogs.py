"""`lynx models`, `lynx hardware` (and `hardware calibrate`), `lynx schema`: the catalogs and file formats."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..io import InputError, dumps, format_bytes, write_atomic
from ..schema import Hardware, Plan, Profile
from .choices import SchemaName
from .options import check_output
from .options import threads as check_threads
from .tables import table
from .terminal import out


def models() -> None:
    from ..models.catalog import MODELS, as_spec

    # Narrow enough for 80 columns; the sources, long, follow the table one per line.
    shown = table("catalog models (MODEL may also be a config.json, a model JSON or a .py file)",
                  [(col, "left" if col in ("name", "family") else "right")
                   for col in ("name", "family", "params", "layers", "hidden", "heads", "ffn", "experts")],
                  show_edge=False, padding=0)
    specs = list(map(as_spec, MODELS.values()))

    def billions(n: int) -> str:
        return f"{n / 1e9:.0f}B" if n >= 100e9 else f"{n / 1e9:.1f}B"

    for m in specs:  # MoE: total/active parameters, top-k/experts x expert FFN width
        params = billions(m.params()) + (f"/{billions(m.active_params())}" if m.moe else "")
        moe = f"{m.moe.top_k}/{m.moe.experts}x{m.moe.expert_ffn}" if m.moe else "-"
        shown.add_row(m.name, m.family, params, str(m.num_layers), str(m.hidden), f"{m.heads}/{m.kv}",
                      str(m.ffn_hidden), moe)
    out.print(shown)
    out.print("sources:")
    for m in specs:
        out.print(f"  {m.name}: {m.source} (vocab {m.vocab})", soft_wrap=True)


def hardware(action: str | None, output: Path | None, name: str, threads: int, repeats: int) -> None:
    if action is not None:
        if action != "calibrate":
            raise InputError(f"lynx hardware: unknown action {action!r} (expected nothing or 'calibrate')")
        if output is None:
            raise InputError("lynx hardware calibrate: -o FILE.json is required")
        check_output(output)
        check_threads(threads)
        from ..calibrate import calibrate

        hw = calibrate(name=name, threads=threads, repeats=repeats)
        write_atomic(output, dumps(hw))
        out.print(f"wrote {output}: GEMM {hw.peak_flops / 1e9:.1f} GFLOP/s, memory "
                  f"{hw.hbm_bytes_per_s / 1e9:.1f} GB/s, {hw.backend} p2p {hw.p2p_bytes_per_s / 1e9:.2f} GB/s + "
                  f"{hw.p2p_latency_s * 1e6:.0f} us, all-reduce busbw {hw.intra_node_bus_bytes_per_s / 1e9:.2f} "
                  f"GB/s + {hw.intra_node_latency_s * 1e6:.0f} us, interference {hw.interference:.2f}")
        if hw.host_d2h_bytes_per_s is None:
            out.print("host link: none measured (a CPU device: activations already live in host memory, there is "
                      "nothing to offload to)")
        else:
            out.print(f"host link: device-to-host {hw.host_d2h_bytes_per_s / 1e9:.1f} GB/s, host-to-device "
                      f"{hw.host_h2d_bytes_per_s / 1e9:.1f} GB/s, {(hw.host_copy_latency_s or 0) * 1e6:.1f} us per copy (pinned; set pinned_host_bytes in the file for "
                      "the host memory offload may fill)")
        return
    if output is not None:
        raise InputError("lynx hardware: -o applies to `lynx hardware calibrate`")
    from ..models.hardware import HARDWARE

    shown = table("hardware (efficiencies and bus bandwidths are assumptions to calibrate)",
                  [(col, "left" if col == "name" else "right")
                   for col in ("name", "memory", "peak\nTFLOP/s", "HBM\nGB/s", "intra-node\nbusbw GB/s",
                               "inter-node\nbusbw GB/s")])
    for h in HARDWARE.values():
        shown.add_row(h.name, format_bytes(h.memory_bytes), f"{h.peak_flops / 1e12:.1f}",
                      f"{h.hbm_bytes_per_s / 1e9:.0f}", f"{h.intra_node_bus_bytes_per_s / 1e9:.0f}",
                      f"{h.inter_node_bus_bytes_per_s / 1e9:.0f}")
    out.print(shown)


def schema(name: SchemaName) -> None:
    from ..models.spec import ModelSpec

    cls = {"profile": Profile, "plan": Plan, "hardware": Hardware, "model": ModelSpec}[name.value]
    typer.echo(json.dumps(cls.model_json_schema(), indent=1))
