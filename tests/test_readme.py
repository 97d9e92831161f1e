"""Every shell block of the README and of docs/integrations.md runs as written, in order, in a fresh directory that
sees the repository's files; so do those of docs/guide.md's FSDP / CP section (the rest of the guide repeats the
README's commands or takes minutes). Skipped, with the reason: the set-up block (CI has just installed lynx and is running
these tests) and blocks marked `<!-- slow: reason -->` (run them with LYNX_DOCS_SLOW=1)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/integrations.md", "docs/guide.md#fsdp"]
SECTIONS = {"fsdp": "## FSDP, HSDP and context parallelism"}  # doc#key: from that heading to the next "## "
SHARED = ["examples", "profiles", "plans", "bench", "lynx_planner", "benchmarks"]


def blocks(doc: str) -> list[tuple[str, str | None]]:
    """(shell text, reason to skip or None) of each ```bash block, in order (of one section: `doc#key`)."""
    path, _, key = doc.partition("#")
    text = (ROOT / path).read_text()
    if key:
        text = text[text.index(SECTIONS[key]):]
        text = text[:text.find("\n## ", 1) % (len(text) + 1)]
    out = []
    for m in re.finditer(r"(<!-- slow: (?P<slow>[^>]*) -->\n)?```bash\n(?P<body>.*?)```", text, re.S):
        body = m.group("body")
        skip = None
        if "pip install" in body or "pytest" in body:
            skip = "the set-up: CI installs lynx and runs the tests itself"
        elif m.group("slow") and not os.environ.get("LYNX_DOCS_SLOW"):
            skip = f"slow ({m.group('slow')}); LYNX_DOCS_SLOW=1 runs it"
        out.append((body, skip))
    return out


def test_blocks_are_found():
    assert len(blocks("README.md")) >= 5 and len(blocks("docs/integrations.md")) >= 3
    assert len(blocks("docs/guide.md#fsdp")) == 4


@pytest.mark.parametrize("doc", DOCS)
def test_shell_blocks_run_in_order(doc, tmp_path):
    for name in SHARED:
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "docs").mkdir()
    env = os.environ | {"PYTHONPATH": str(ROOT), "COLUMNS": "100", "MPLBACKEND": "Agg"}
    ran = 0
    for body, skip in blocks(doc):
        if skip:
            continue
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"{doc}: block failed:\n{body}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n" \
                                  f"{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr, r.stderr
        ran += 1
    assert ran >= 2
