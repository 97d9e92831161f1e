"""Caching of facts derived from an immutable object (a Block), keyed by the object itself."""

from __future__ import annotations

from functools import wraps
from typing import Callable, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def per_object(fn: Callable[[T], R]) -> Callable[[T], R]:
    """Memoise fn(obj) by identity: cheaper than hashing a large pydantic model. Objects must not be mutated."""
    memo: dict[int, tuple[T, R]] = {}

    @wraps(fn)
    def wrapper(obj: T) -> R:
        hit = memo.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = fn(obj)
        memo[id(obj)] = (obj, value)  # holding obj keeps its id from being reused
        return value

    wrapper.cache_clear = memo.clear  # type: ignore[attr-defined]
    return wrapper
