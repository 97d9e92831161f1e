"""The figures and tables the commands print: one table shape (title on the left, a rule under the header, no
cut cells), seconds as ms or s, bytes in one unit per column (GiB, or MiB/KiB for tiny models), signed percents."""

from __future__ import annotations

from rich.table import Table


def table(title: str, columns, **options) -> Table:
    """A table with these (name, justify) columns, each kept on one line (figures and op ids are never cut)."""
    from rich import box

    made = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, **options)
    for name, justify in columns:
        made.add_column(name, justify=justify, no_wrap=True)
    return made


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def unit(values: list[float | None]) -> tuple[str, int]:
    """One unit for a table's byte column: GiB, or MiB/KiB where GiB would print 0.0x (tiny models)."""
    top = max((abs(v) for v in values if v is not None), default=0)
    return next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20)) if top >= 0.1 * s), ("KiB", 2**10))


def in_unit(n: float | None, size: int) -> str:
    return "-" if n is None else f"{n / size:.2f}"


def percent(fraction: float) -> str:
    """'+1.2%', '-0.3%', '+0.0%' (never '+-0.0%')."""
    value = round(fraction * 100, 1)
    return f"{value + 0.0:+.1f}%"  # + 0.0 turns -0.0 into 0.0
