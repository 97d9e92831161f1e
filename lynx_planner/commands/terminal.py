"""The terminal side of every command: stdout and stderr consoles, bad input and a full stdout turned into exit 2
with a short message, Ctrl-C into exit 130, progress bars, the terminal's width."""

from __future__ import annotations

import errno
import functools
import io
import os
import sys
from typing import Any, Callable

import typer
from pydantic import ValidationError
from rich.console import Console

from ..io import (
    InputError,
    Outputs,
    catch_interrupts,
    describe_validation,
    raise_if_interrupted,
    restore_interrupts,
)

out = Console(highlight=False, soft_wrap=True)  # stdout (resolved at print time, so test runners can capture it)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    lines = str(message).strip().splitlines() or ["error"]
    typer.echo(f"error: {lines[0]}", err=True)
    for line in lines[1:]:
        typer.echo(f"  {line}", err=True)
    raise typer.Exit(code)


def guarded(fn: Callable) -> Callable:
    """Turn bad input into exit 2 with a short message on stderr (set LYNX_DEBUG=1 to see tracebacks), and Ctrl-C
    into exit 130, also when a native solver swallowed it (io.catch_interrupts records it). The command's output files
    are put in place only once it succeeded and its report reached stdout (`io.Outputs`): a failure leaves none."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = catch_interrupts()
        try:
            with Outputs() as outputs:  # the files it writes appear once the command's report is out
                try:
                    result = fn(*args, **kwargs)
                    raise_if_interrupted()
                except typer.Exit as e:
                    flush_stdout()  # a check's verdict (exit 1) that could not be printed is not a verdict
                    if e.exit_code in (0, 1):  # done, or a verdict (bench --check keeps its report)
                        outputs.commit()
                    raise
                try:
                    flush_stdout()
                except BrokenPipeError:  # the reader left once it had enough (`| head -1`): the command is done
                    silence_stdout()
                outputs.commit()
            return result
        except OSError as e:  # stdout full or closed (`lynx check p.json > /dev/full`), or a file that vanished
            if os.environ.get("LYNX_DEBUG"):
                raise
            silence_stdout()
            fail(f"cannot write output: {e.strerror or e}" if e.errno in WRITE_ERRNOS else f"{e}")
        except InputError as e:
            if os.environ.get("LYNX_DEBUG"):
                raise
            fail(str(e))
        except ValidationError as e:
            if os.environ.get("LYNX_DEBUG"):
                raise
            fail(describe_validation(e.title, e))
        except KeyboardInterrupt:
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        finally:
            restore_interrupts(previous)

    return wrapper


WRITE_ERRNOS = {errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EBADF}


def flush_stdout() -> None:
    """Push printed output out now, inside the guard (else a full disk surfaces at interpreter exit as a traceback
    with exit 120)."""
    sys.stdout.flush()


def silence_stdout() -> None:
    """After a failed write to stdout, point it at /dev/null so the interpreter's own flush at exit cannot fail
    again (the recipe of Python's signal docs for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no real file (a test runner's buffer)
        pass


# The reader of stdout left (`lynx profile ... | head -1`): what it read is what it wanted, so the command carries on
# (its files are written) with further output discarded; rich's default exits 1 mid-command, leaving no files.
out.on_broken_pipe = silence_stdout  # type: ignore[method-assign]


def progress(disable: bool = False):
    """A transient progress bar on stderr: description, bar, done/total, elapsed time. Off where stderr is no
    terminal (a pipe, a file, a CI log): there it would only leave an empty line."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=err, transient=True, disable=disable or not err.is_terminal)


def progress_bar(description: str):
    """A transient progress bar on stderr, and the callback tune.py reports to."""
    bar = progress()
    task = bar.add_task(description, total=None)

    def report(done: int, total: int, label: str) -> None:
        bar.update(task, completed=done, total=total, description=f"{description} {label}".rstrip())

    return bar, report


def width() -> int:
    import shutil

    return max(60, shutil.get_terminal_size((100, 24)).columns)
