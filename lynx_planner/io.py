"""Reading and writing lynx files: clear errors naming the file and field, strict JSON, atomic writes that destroy
nothing (and, for a command, appear all together once it succeeded), content hashes, and the Ctrl-C flag that stops
a write after a native solver swallowed the interrupt."""

from __future__ import annotations

import _thread
import hashlib
import json
import math
import os
import re
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError


class InputError(Exception):
    """Bad input from the user: the CLI prints the message and exits with code 2."""


class LayoutError(InputError, ValueError):
    """The model cannot run in the layout asked for (a parallel size that does not divide it, a dimension its layers
    cannot use): bad input for `profile`, a layout to leave out for `tune`."""


M = TypeVar("M", bound=BaseModel)

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


# The largest size accepted (8 EiB, a signed 64-bit byte count): far above any device, and small enough that the
# MILPs' memory rows (in MiB) stay well inside HiGHS's numeric range.
MAX_SIZE = 2**63 - 1


def parse_size(text: str, what: str = "size") -> int:
    """'80GiB', '40GB', '512MiB' or a plain number of bytes, at most MAX_SIZE."""
    m = _SIZE.match(str(text))
    if not m:
        raise InputError(f"{what}: {text!r} is not a size (expected e.g. 80GiB, 40GB, 512MiB or a number of bytes)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "B").lower()]
    if value <= 0:
        raise InputError(f"{what}: {text!r} must be positive")
    if not value <= MAX_SIZE:  # also catches inf (a 309-digit number)
        raise InputError(f"{what}: {_short(text)} is too large (at most {MAX_SIZE} bytes, 8 EiB)")
    return int(value)


def _short(text: str) -> str:
    text = str(text).strip()
    return repr(text) if len(text) <= 24 else f"{text[:12]!r}...({len(text)} characters)"


def format_bytes(n: float) -> str:
    """GiB with two decimals; MiB or KiB where GiB would print as 0.0x (tiny models)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if abs(n) >= 0.1 * size:
            return f"{n / size:.2f} {unit}"
    return f"{n / 2**10:.2f} KiB"


def describe_validation(path: str | Path, err: ValidationError) -> str:
    lines = []
    for e in err.errors()[:3]:
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"{path}: field {field}: {e['msg']}")
    return "\n".join(lines)


class _NonFinite(str):
    """What NaN, Infinity and -Infinity parse to, so that the field holding one can be named."""


def nonfinite_field(data: object, path: str = "") -> tuple[str, str] | None:
    """(dotted path, value) of the first non-finite number (or _NonFinite marker) in parsed JSON, else None."""
    if isinstance(data, _NonFinite) or (isinstance(data, float) and not math.isfinite(data)):
        return path or "(top level)", str(data)
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        found = nonfinite_field(v, f"{path}.{k}" if path else str(k))
        if found:
            return found
    return None


def load_json(path: str | Path) -> object:
    """Strict JSON: NaN and Infinity, which Python's json accepts by default, are refused with the field named."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    try:
        data = json.loads(text, parse_constant=_NonFinite)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (RecursionError, ValueError) as e:  # nesting too deep, an integer of more than 4300 digits
        raise InputError(f"{path}: not valid JSON ({type(e).__name__}: {str(e)[:80]})") from None
    found = nonfinite_field(data)
    if found:
        raise InputError(f"{path}: field {found[0]}: {found[1]} is not a number JSON allows (strict JSON: no NaN or "
                         "Infinity, and no number too large for a double)")
    return data


def load_model(path: str | Path, cls: type[M]) -> M:
    data = load_json(path)
    known = _versions(cls)
    if isinstance(data, dict) and data.get("schema_version", 1) not in known:
        raise InputError(f"{path}: field schema_version: {data['schema_version']!r} is not supported (expected "
                         f"{' or '.join(map(str, known))})")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        raise InputError(describe_validation(path, e)) from None


def _versions(cls: type) -> tuple[int, ...]:
    """The schema versions a model class reads (plans: 1, and 2 for plans that offload)."""
    from typing import get_args

    field = getattr(cls, "model_fields", {}).get("schema_version")
    return tuple(get_args(field.annotation)) or (1,) if field is not None else (1,)


def find_beside(recorded: str, anchor: str | Path) -> Path | None:
    """A path recorded in a file (a plan's profile_path), looked for beside that file first: relative to its
    directory, then by name in its directory, and only then as given (relative to the working directory), so that a
    same-named file in the working directory does not shadow the one that travels with the plan."""
    here = Path(anchor).parent
    for candidate in (here / recorded, here / Path(recorded).name, Path(recorded)):
        if candidate.is_file():
            return candidate
    return None


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def dumps_json(data: object, what: str = "output", **kwargs: object) -> str:
    """Strict, deterministic JSON text: a non-finite number is refused (naming its field), never written."""
    found = nonfinite_field(data)
    if found:
        raise InputError(f"{what}: field {found[0]}: {found[1]} cannot be written as JSON (not finite)")
    return json.dumps(data, allow_nan=False, **kwargs) + "\n"  # type: ignore[arg-type]


def dumps(model: BaseModel) -> str:
    """Deterministic JSON text of a model (same model, same bytes)."""
    return dumps_json(model.model_dump(mode="json"), type(model).__name__.lower(), indent=1)


# --- outputs ------------------------------------------------------------------------------------------------------


def output_target(path: str | Path) -> Path:
    """Where writing `path` lands: a symlink is followed to its target (the link stays, the file it names is
    replaced). Anything there must be a regular file: a device, FIFO, socket or directory is refused, so that
    the rename in write_atomic can never replace one."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise InputError(f"{path}: cannot write: {e.strerror}") from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a device, FIFO or socket)"
        raise InputError(f"{path}: cannot write: it is {kind}; lynx only replaces regular files")
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{path}: cannot write: directory {directory} does not exist")
    return target


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two existing paths name one file (through symlinks, hard links, `..`): if either does not exist,
    writing one cannot destroy the other."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write to a temporary file beside the target, then rename it over: a reader never sees a partial file, and
    only a regular file (or nothing) is ever replaced. A new file gets the umask's mode, a replaced one keeps its
    own. Nothing is written once Ctrl-C was pressed, even if a native solver swallowed it. Inside `Outputs` the
    rename waits for the command to succeed."""
    raise_if_interrupted()
    target = output_target(path)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise InputError(f"{path}: cannot write: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        raise_if_interrupted()
        if _outputs:
            _outputs[-1].staged.append((Path(tmp), target, path))
        else:
            _replace(Path(tmp), target, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise InputError(f"{path}: cannot write: {e.strerror}") from None
        raise


def _replace(tmp: Path, target: Path, path: str | Path) -> None:
    try:
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{path}: cannot write: {e.strerror}") from None


def make_directory(path: Path, what: str) -> None:
    """mkdir -p; inside `Outputs` the directories made are removed again (if still empty) when the command fails."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{path}: {what}: cannot create the directory: {e.strerror}") from None
    if _outputs:
        _outputs[-1].made += missing  # deepest first


class Outputs:
    """A command's output files, all or nothing: inside `with Outputs() as outputs:` each write_atomic leaves its
    file staged beside its target, and only `outputs.commit()` (once the command succeeded and its report reached
    stdout) moves them into place. Leaving without a commit (an error, a full stdout, Ctrl-C) removes the staged
    files and the directories made for them, so a failed command leaves no output behind."""

    def __init__(self) -> None:
        self.staged: list[tuple[Path, Path, str | Path]] = []
        self.made: list[Path] = []

    def __enter__(self) -> "Outputs":
        _outputs.append(self)
        return self

    def commit(self) -> None:
        raise_if_interrupted()
        staged, self.staged, self.made = self.staged, [], []
        for i, (tmp, target, path) in enumerate(staged):
            try:
                _replace(tmp, target, path)
            except InputError:
                for later, _, _ in staged[i + 1:]:
                    later.unlink(missing_ok=True)
                raise

    def __exit__(self, *exc: object) -> None:
        _outputs.remove(self)
        for tmp, _, _ in self.staged:
            tmp.unlink(missing_ok=True)
        for directory in self.made:
            try:
                directory.rmdir()
            except OSError:  # not empty (something else was written there): keep it
                break


_outputs: list[Outputs] = []  # the Outputs being collected (innermost last)


# --- Ctrl-C -------------------------------------------------------------------------------------------------------
# HiGHS (through pyomo) holds the interpreter while it solves and runs only its interrupt callbacks in Python, so
# Ctrl-C's handler runs inside one of those, where a KeyboardInterrupt would be swallowed and HiGHS would solve on to
# its time limit. So the handler records the interrupt (every solve result and every write checks the record), and
# when it finds itself inside HiGHS it asks that solver to stop (highspy's cancelSolve, honoured by the callback it
# interrupted) and raises the KeyboardInterrupt again once Python runs outside the solver.

_interrupted = False


def _on_sigint(signum: int, frame: object) -> None:
    global _interrupted
    _interrupted = True
    if _stop_native_solver(frame):
        threading.Timer(0.05, _interrupt_again).start()
        return
    raise KeyboardInterrupt


def _stop_native_solver(frame: object) -> bool:
    while frame is not None:
        for value in list(frame.f_locals.values()):  # type: ignore[attr-defined]
            if type(value).__module__.startswith("highspy") and hasattr(type(value), "cancelSolve"):
                value.cancelSolve()
                return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


def _interrupt_again() -> None:
    if signal.getsignal(signal.SIGINT) is _on_sigint:  # still inside the command
        _thread.interrupt_main(signal.SIGINT)


def catch_interrupts() -> object:
    """Install the recording SIGINT handler (main thread only); returns the previous handler for restore."""
    global _interrupted
    _interrupted = False
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started with SIGINT ignored (nohup, `cmd &`): keep it so
        return None
    try:
        return signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: the default handling stays
        return None


def restore_interrupts(previous: object) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)  # type: ignore[arg-type]


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed since catch_interrupts(), even if something swallowed it."""
    if _interrupted:
        raise KeyboardInterrupt
