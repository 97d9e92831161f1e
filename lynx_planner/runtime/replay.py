"""RNG and autocast state: captured when a region's forward starts (RNG also where a random op's submodule is
entered), replayed when it is recomputed."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RngState:
    cpu: torch.Tensor
    cuda: torch.Tensor | None
    device: torch.device

    @classmethod
    def capture(cls, device: torch.device) -> RngState:
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        return cls(torch.get_rng_state(), cuda, device)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)

    def fork(self) -> contextlib.AbstractContextManager:
        """A scope whose RNG changes are undone at exit (the recomputation must not move the training RNG)."""
        devices = [self.device] if self.cuda is not None else []
        return torch.random.fork_rng(devices=devices, device_type=self.device.type)


@dataclass(frozen=True)
class AutocastState:
    settings: tuple[tuple[str, bool, torch.dtype], ...]
    cache_enabled: bool

    @classmethod
    def capture(cls, device: torch.device) -> AutocastState:
        kinds = dict.fromkeys([device.type, "cpu"])
        settings = tuple((k, torch.is_autocast_enabled(k), torch.get_autocast_dtype(k)) for k in kinds)
        return cls(settings, torch.is_autocast_cache_enabled())

    def apply(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for kind, enabled, dtype in self.settings:
            stack.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled, cache_enabled=self.cache_enabled))
        return stack


def autocast_off(device: torch.device) -> contextlib.ExitStack:
    """A replay of recorded aten ops runs with autocast off: the recording already holds autocast's casts."""
    stack = contextlib.ExitStack()
    for kind in dict.fromkeys([device.type, "cpu"]):
        stack.enter_context(torch.autocast(kind, enabled=False))
    return stack
