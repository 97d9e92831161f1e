"""Releasing a stage's recomputations inside `torch.distributed.pipelining` schedules (Schedule1F1B, ScheduleGPipe).

`attach(stage)` wraps three methods of the `PipelineStage` instance (public API):
  forward_one_chunk(mb)   sets the runtime's micro-batch (None outside it); at its start releases prev_forward for
                          the micro-batch whose backward comes right after this forward, as lynx_planner/placements.py
                          says (the table the simulator reads: the plan's schedule and micro-batch count; a 1F1B
                          schedule run with another count releases at most less, never at another point)
  get_bwd_recv_ops(mb)    marks mb's grad_wait recomputation as pending
  backward_one_chunk(mb)  releases mb's grad_wait first if still pending (on CUDA the recomputation runs on the side
                          stream, overlapping the main stream's wait for the gradient), then runs the backward
On CPU (gloo) a receive's `wait()` blocks the host, so the pending grad_wait recomputation must run between posting
the gradient receive and waiting on it; only a private hook offers that point (`_install_wait_hook`, pinned by
tests/test_runtime_pipelining.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.pipelining import schedules

from .. import placements
from .apply import LynxRuntime, runtime_of

_pending: list[tuple[LynxRuntime, int]] = []  # grad_wait recomputations whose gradient receive is being posted


def _run_pending() -> None:
    while _pending:
        runtime, micro_batch = _pending.pop(0)
        runtime.trigger(micro_batch, "grad_wait")


# --- the one private hook -------------------------------------------------------------------------------------------
# Schedule1F1B and ScheduleGPipe post the gradient receive with `schedules._batch_p2p` and then block in
# `schedules._wait_batch_p2p(works)`, a module global looked up at call time. Wrapping it runs the pending
# recomputations while the receive is in flight.
_ORIGINAL_WAIT = schedules._wait_batch_p2p


def _wait_batch_p2p(work: list) -> None:
    _run_pending()
    _ORIGINAL_WAIT(work)


def _install_wait_hook() -> None:
    schedules._wait_batch_p2p = _wait_batch_p2p
# ---------------------------------------------------------------------------------------------------------------------


class _StageHooks:
    def __init__(self, runtime: LynxRuntime, stage: Any):
        self.runtime = runtime
        par = runtime.parallel
        # {j: k}: the forward of micro-batch j releases k's prev_forward recomputations
        self.fires = placements.prev_forward_releases(par.schedule, stage.num_stages, stage.stage_index,
                                                      par.num_microbatches)
        self.forward, self.recv, self.backward = stage.forward_one_chunk, stage.get_bwd_recv_ops, \
            stage.backward_one_chunk

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self.runtime.action = ("F", fwd_chunk_id)
        if fwd_chunk_id in self.fires:
            self.runtime.trigger(self.fires[fwd_chunk_id], "prev_forward")
        self.runtime.micro_batch = fwd_chunk_id
        try:
            return self.forward(fwd_chunk_id, *args, **kwargs)
        finally:
            self.runtime.micro_batch = None

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> Any:
        self.runtime.action = ("B", bwd_chunk_id)
        _pending.append((self.runtime, bwd_chunk_id))
        return self.recv(bwd_chunk_id)

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self.runtime.action = ("B", bwd_chunk_id)
        _pending[:] = [p for p in _pending if p != (self.runtime, bwd_chunk_id)]
        self.runtime.trigger(bwd_chunk_id, "grad_wait")
        return self.backward(bwd_chunk_id, *args, **kwargs)


def attach(stage: Any, module: nn.Module | None = None) -> LynxRuntime:
    """Let a `PipelineStage` release the recomputations of the plan applied to `module` (default: stage.submod)."""
    runtime = runtime_of(module if module is not None else stage.submod)
    hooks = _StageHooks(runtime, stage)
    runtime.micro_batch = None
    stage.forward_one_chunk = hooks.forward_one_chunk
    stage.get_bwd_recv_ops = hooks.get_bwd_recv_ops
    stage.backward_one_chunk = hooks.backward_one_chunk
    _install_wait_hook()
    return runtime
