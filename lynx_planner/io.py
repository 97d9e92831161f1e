"""Reading and writing lynx files: clear errors naming the file and field, atomic writes, content hashes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError


class InputError(Exception):
    """Bad input from the user: the CLI prints the message and exits with code 2."""


M = TypeVar("M", bound=BaseModel)

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, what: str = "size") -> int:
    """'80GiB', '40GB', '512MiB' or a plain number of bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"{what}: {text!r} is not a size (expected e.g. 80GiB, 40GB, 512MiB or a number of bytes)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "B").lower()]
    if value <= 0:
        raise InputError(f"{what}: {text!r} must be positive")
    return int(value)


def format_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def describe_validation(path: str | Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors()[:3]:
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"{path}: field {field}: {e['msg']}")
    return "\n".join(lines)


def load_json(path: str | Path) -> object:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None


def load_model(path: str | Path, cls: type[M]) -> M:
    data = load_json(path)
    if isinstance(data, dict) and data.get("schema_version", 1) != 1:
        raise InputError(f"{path}: field schema_version: {data['schema_version']!r} is not supported (expected 1)")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise InputError(describe_validation(path, e)) from None


def find_beside(recorded: str, anchor: str | Path) -> Path | None:
    """A path recorded in a file (a plan's profile_path): as given, else relative to that file's directory."""
    for candidate in (Path(recorded), Path(anchor).parent / recorded):
        if candidate.is_file():
            return candidate
    return None


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def dumps(model: BaseModel) -> str:
    """Deterministic JSON text of a model (same model, same bytes)."""
    return json.dumps(model.model_dump(mode="json"), indent=1) + "\n"


def write_atomic(path: str | Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees a partial file."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{path}: cannot write: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise InputError(f"{path}: cannot write: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write: {e.strerror}") from None
