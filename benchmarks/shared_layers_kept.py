"""Predicted vs measured kept bytes per layer (per use) for models that call one module at several places: the
[A, B, A] decoder of tests/models/shared_layers.py and Hugging Face ALBERT (tiny config), through the zoo loop
(profile -> HEU plan -> check -> dry run -> apply -> one step; tests/zoo.py).

    python benchmarks/shared_layers_kept.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import zoo  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("shared_layers", "albert"):
            for precision in zoo.PRECISIONS:
                cell = zoo.run_cell(name, precision, Path(tmp))
                print(f"{name} {precision}: {'ok' if cell.ok else cell.error or 'bytes off'} "
                      f"(policies {cell.modes}: n none, s selective, f full)")
                print(f"  {'layer':<42} {'predicted B':>12} {'measured B':>12} {'error':>8}")
                for layer, pred, meas in zip(cell.layers, cell.predicted_layers, cell.measured_layers):
                    err = f"{(meas - pred) / pred:+.1%}" if pred else "-"
                    print(f"  {layer:<42} {pred:>12,} {meas:>12,} {err:>8}")
                total = f"{cell.bytes_error:+.2%}" if cell.bytes_error is not None else "-"
                print(f"  {'total':<42} {cell.predicted_bytes:>12,} {cell.measured_bytes:>12,} {total:>8}")


if __name__ == "__main__":
    main()
