"""Running a user's model file: its errors, sys.exit and os._exit are bad input (exit 2, no traceback, nothing
written); Ctrl-C stays an interrupt."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable

import typer

from ..io import InputError


class _HardExit(BaseException):
    def __init__(self, code: object) -> None:
        self.code = code


@contextlib.contextmanager
def _no_hard_exit():
    """os._exit in a model file would end lynx at once with the file's code (0: success, nothing written): in this
    process it raises instead while user code runs. Forked children (data loaders, workers) still exit for real."""
    real, me = os._exit, os.getpid()

    def refuse(code: int) -> None:
        if os.getpid() != me:
            real(code)
        raise _HardExit(code)

    os._exit = refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real


def call_model_file(path: Path, what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run user code (a model file): any failure is bad input (exit 2), reported without a traceback; so is a model
    file that exits (sys.exit would otherwise end lynx with the file's own code and no output). Ctrl-C, or a
    KeyboardInterrupt the file raises, stays an interrupt (exit 130)."""
    try:
        with _no_hard_exit():
            return fn(*args, **kwargs)
    except (InputError, typer.Exit, KeyboardInterrupt):
        raise
    except _HardExit as e:
        raise InputError(f"{path}: {what} failed: the model file called os._exit({e.code!r}) (a model file must "
                         "build the model and return)") from None
    except SystemExit as e:
        raise InputError(f"{path}: {what} failed: the model file called sys.exit({e.code!r}) (a model file must "
                         "build the model and return)") from None
    except Exception as e:  # the model file's own error
        if os.environ.get("LYNX_DEBUG"):
            raise
        raise InputError(f"{path}: {what} failed: {type(e).__name__}: {e} (set LYNX_DEBUG=1 for the traceback)") \
            from None
