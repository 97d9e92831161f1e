"""Every shell block of the README and of every docs/ page runs as written, in order, in a fresh directory that sees
the repository's files, and prints what the page shows: a plain block right after a shell block is that block's
output, and each of its lines must appear in what the commands printed (durations, the only thing that varies
from run to run, masked). Skipped, with the reason: the set-up block (CI has just installed lynx and is running these
tests) and blocks marked `<!-- slow: reason -->` (run them with LYNX_DOCS_SLOW=1)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ["examples", "profiles", "plans", "bench", "benchmarks", "scripts", "tests", "lynx_planner"]
FENCE = re.compile(r"^(?:<!-- slow: (?P<slow>[^>]*) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)^```\n", re.S | re.M)
DURATION = re.compile(r"\d+(?:\.\d+)?\s?(?:ms|s|µs|us|min)\b")


def pages_with_shell_blocks() -> list[str]:
    pages = ["README.md"] + [f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in pages if "```bash\n" in (ROOT / p).read_text()]


DOCS = pages_with_shell_blocks()


def blocks(doc: str) -> list[tuple[str, str | None, str | None]]:
    """(shell text, reason to skip or None, the output the page shows or None) of each ```bash block, in order."""
    text = (ROOT / doc).read_text()
    out: list[tuple[str, str | None, str | None]] = []
    end = None
    for m in FENCE.finditer(text):
        if m.group("lang") == "" and out and out[-1][2] is None and end is not None \
                and not text[end:m.start()].strip():
            body, skip, _ = out[-1]
            out[-1] = (body, skip, m.group("body"))
        if m.group("lang") == "bash":
            body = m.group("body")
            skip = None
            if "pip install" in body or "pytest" in body:
                skip = "the set-up: CI installs lynx and runs the tests itself"
            elif m.group("slow") and not os.environ.get("LYNX_DOCS_SLOW"):
                skip = f"slow ({m.group('slow')}); LYNX_DOCS_SLOW=1 runs it"
            out.append((body, skip, None))
        end = m.end()
    return out


def normalise(line: str) -> str:
    return " ".join(DURATION.sub("<t>", line).split())


def missing_lines(shown: str, printed: str) -> list[str]:
    """The lines of `shown` (rules of box-drawing characters aside) that `printed` lacks, durations masked."""
    have = {normalise(line) for line in printed.splitlines()}
    return [line for line in shown.splitlines()
            if line.strip() and set(line.strip()) - set("─-=│ ") and normalise(line) not in have]


def test_blocks_are_found():
    assert len(blocks("README.md")) >= 5 and "docs/guide.md" in DOCS and "docs/integrations.md" in DOCS
    assert sum(shown is not None for _, _, shown in blocks("README.md")) >= 2


def test_missing_lines_masks_durations_only():
    shown = " heu     2.3611    1.366x   103.0 ms\n ───────\n"
    assert missing_lines(shown, "heu 2.3611 1.366x 1.24 s") == []
    assert missing_lines(shown, "heu 2.3612 1.366x 103.0 ms") == [shown.splitlines()[0]]


@pytest.mark.parametrize("doc", DOCS)
def test_shell_blocks_run_in_order_and_print_what_the_page_shows(doc, tmp_path):
    for name in SHARED:
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "docs").mkdir()
    env = os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "100", "MPLBACKEND": "Agg"}
    ran = 0
    for body, skip, shown in blocks(doc):
        if skip:
            continue
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"{doc}: block failed:\n{body}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n" \
                                  f"{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr, r.stderr
        if shown is not None:
            lost = missing_lines(shown, r.stdout)
            assert not lost, f"{doc}: the block\n{body}\nno longer prints these lines the page shows:\n" + \
                "\n".join(lost) + f"\n--- it printed\n{r.stdout[-4000:]}"
        ran += 1
    assert ran >= 1
