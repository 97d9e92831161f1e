"""Releasing a stage's recomputations inside `torch.distributed.pipelining` schedules (Schedule1F1B, ScheduleGPipe,
ScheduleInterleaved1F1B with several chunks per rank).

`attach(stage)` wraps four methods of the `PipelineStage` instance (public API):
  get_fwd_recv_ops(mb)    first call: checks that the schedule stepping the stage is the plan's (`check_schedule`)
  forward_one_chunk(mb)   the same check; sets the runtime's micro-batch (None outside it); at its start releases
                          prev_forward for the (chunk, micro-batch) whose backward comes right after this forward on
                          the rank, as lynx_planner/placements.py says (the table the simulator reads: the plan's
                          schedule and micro-batch count; a 1F1B schedule run with another count releases at most
                          less, never at another point)
  get_bwd_recv_ops(mb)    marks mb's grad_wait recomputation as pending
  backward_one_chunk(mb)  releases mb's grad_wait first if still pending (on CUDA the recomputation runs on the side
                          stream, overlapping the main stream's wait for the gradient), then runs the backward
On CPU (gloo) a receive's `wait()` blocks the host, so the pending grad_wait recomputation must run between posting
the gradient receive and waiting on it; only a private hook offers that point (`_install_wait_hook`, pinned by
tests/test_runtime_pipelining.py).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import schedules
from torch.utils._pytree import tree_map_only

from .. import placements
from .. import schedules as lynx_schedules
from .apply import LynxRuntime, runtime_of
from .errors import PlanMismatchError

_pending: list[tuple[LynxRuntime, int]] = []  # grad_wait recomputations whose gradient receive is being posted


def _run_pending(only: tuple[int, int] | None = None) -> None:
    """Release the pending grad_wait recomputations (`only`: those of one (virtual stage, micro-batch))."""
    for entry in list(_pending):
        runtime, micro_batch = entry
        if only is None or (runtime.stage, micro_batch) == only:
            _pending.remove(entry)
            runtime.action = ("B", micro_batch)  # a forward of the chunk may have run since the receive was posted
            runtime.trigger(micro_batch, "grad_wait")


# --- the one private hook -------------------------------------------------------------------------------------------
# Schedule1F1B and ScheduleGPipe post the gradient receive with `schedules._batch_p2p` and then block in
# `schedules._wait_batch_p2p(works)`, a module global looked up at call time. Wrapping it runs the pending
# recomputations while the receive is in flight. Schedules with several stages per rank (_PipelineScheduleRuntime)
# post receives ahead and wait right before the action that needs them, the `action` of the calling frame: only a
# backward's wait releases, and only that (stage, micro-batch)'s recomputations.
_ORIGINAL_WAIT = schedules._wait_batch_p2p
_BACKWARDS = (schedules._ComputationType.FULL_BACKWARD, schedules._ComputationType.BACKWARD_INPUT)


def _wait_batch_p2p(work: list) -> None:
    action = sys._getframe(1).f_locals.get("action")
    kind = getattr(action, "computation_type", None)
    if kind is None:
        _run_pending()
    elif kind in _BACKWARDS:
        _run_pending((action.stage_index, action.microbatch_index))
    _ORIGINAL_WAIT(work)


def _install_wait_hook() -> None:
    schedules._wait_batch_p2p = _wait_batch_p2p
# ---------------------------------------------------------------------------------------------------------------------


_ATTACHED: dict[int, LynxRuntime] = {}  # this process's attached runtimes by virtual stage (a rank's chunks)


def running_schedule() -> Any:
    """The torch.distributed.pipelining schedule whose step() is running this call, or None (a custom loop)."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, schedules._PipelineSchedule):
            return owner
        frame = frame.f_back
    return None


def check_schedule(parallel: Any, schedule: Any) -> None:
    """Refuse, before the first forward or receive of a step, a torch schedule that does not run the plan's order:
    another class, or (several chunks per rank) another micro-batch count."""
    if schedule is None:
        return
    spec = lynx_schedules.get(parallel.schedule)
    expected = getattr(schedules, spec.torch_class)
    if type(schedule) is not expected:
        raise PlanMismatchError(
            f"the stage runs under {type(schedule).__name__}, but the plan was made for the {parallel.schedule!r} "
            f"schedule ({spec.torch_class}): its recomputations are placed for that order of work. Run the plan's "
            f"schedule, or re-profile with --schedule for the one you run")
    m = getattr(schedule, "_n_microbatches", parallel.num_microbatches)
    if m != parallel.num_microbatches and spec.virtual != (1, 1):
        raise PlanMismatchError(
            f"{type(schedule).__name__} runs {m} micro-batches, the plan was made for {parallel.num_microbatches}: "
            "with several chunks per rank the order of work depends on the count; re-profile with "
            f"--num-microbatches {m}")


class _StageHooks:
    def __init__(self, runtime: LynxRuntime, stage: Any):
        self.runtime = runtime
        par = runtime.parallel
        self.parallel = par
        self.chunk = stage.stage_index
        # {(chunk, j): (c, k)}: on this rank, the forward of micro-batch j on a chunk releases c's k's prev_forward
        self.fires = placements.prev_forward_fires(par.schedule, par.pp, par.virtual_stages,
                                                   lynx_schedules.rank_of(par.pp, stage.stage_index),
                                                   par.num_microbatches)
        self.forward, self.recv, self.backward = stage.forward_one_chunk, stage.get_bwd_recv_ops, \
            stage.backward_one_chunk
        self.fwd_recv = getattr(stage, "get_fwd_recv_ops", None)
        self.checked = False
        self.stage = stage

    def _check(self) -> None:
        if not self.checked:
            check_schedule(self.parallel, running_schedule())
            self.checked = True

    def get_fwd_recv_ops(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self.fwd_recv(fwd_chunk_id, *args, **kwargs)

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self._check()
        self.runtime.action = ("F", fwd_chunk_id)
        target = self.fires.get((self.chunk, fwd_chunk_id))
        released = None if target is None else self.runtime if target[0] == self.chunk else _ATTACHED.get(target[0])
        if released is not None:  # another chunk's runtime records this forward as what released it, meanwhile
            before, released.action = released.action, ("F", fwd_chunk_id)
            released.trigger(target[1], "prev_forward")
            if released is not self.runtime:
                released.action = before
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
        result = self.backward(bwd_chunk_id, *args, **kwargs)
        _drop_output_graph(self.stage, bwd_chunk_id)
        return result


def _drop_output_graph(stage: Any, micro_batch: int) -> None:
    """After a micro-batch's backward on the last stage, its output kept for the step's result (`output_chunks`, one
    per micro-batch in forward order) no longer holds its graph. torch detaches that output in place, but not a view
    (a head ending in `.transpose(0, 1)`); under a split backward the view then held, until the step ended, every
    tensor of the graph that only B reads (W frees the rest): 27.5 MiB of 88 per micro-batch of a GPT stage,
    docs/zero-bubble-memory.md. Same values, as torch returns them for a non-view output."""
    chunks = getattr(stage, "output_chunks", None)  # (a stage-like object without them: nothing to do)
    if getattr(stage, "is_last", False) and chunks is not None and micro_batch < len(chunks):
        chunks[micro_batch] = tree_map_only(torch.Tensor, lambda t: t.detach(), chunks[micro_batch])


def no_outputs(schedule: Any) -> dict:
    """Keywords for the last stage's `schedule.step`: `return_outputs=False` where this torch takes it (newer than 2.4,
    whose step passes unknown keywords to the model), as torchtitan's trainer calls it. With outputs returned, torch
    keeps every micro-batch's output until the step ends: m outputs on the last rank that a plan does not count."""
    return {"return_outputs": False} if "return_outputs" in inspect.signature(schedule.step).parameters else {}


def attach(stage: Any, module: nn.Module | None = None) -> LynxRuntime:
    """Let a `PipelineStage` release the recomputations of the plan applied to `module` (default: stage.submod).
    With several chunks per rank, attach each chunk's stage (the plan's stage = the stage's `stage_index`). The
    schedule that steps the stage must be the plan's (checked at the step's first forward or receive)."""
    runtime = runtime_of(module if module is not None else stage.submod)
    par = runtime.parallel
    chunks = par.pp * par.virtual_stages
    if stage.num_stages != chunks or stage.stage_index != runtime.stage:
        raise PlanMismatchError(
            f"the PipelineStage is stage {stage.stage_index} of {stage.num_stages}, but the plan applied to its module "
            f"is for stage {runtime.stage} of {chunks} (pp {par.pp} x {par.virtual_stages} virtual stages, "
            f"{par.schedule}): build the stage with stage_index={runtime.stage}, num_stages={chunks}")
    hooks = _StageHooks(runtime, stage)
    runtime.micro_batch = None
    stage.forward_one_chunk = hooks.forward_one_chunk
    stage.get_fwd_recv_ops = hooks.get_fwd_recv_ops
    stage.get_bwd_recv_ops = hooks.get_bwd_recv_ops
    stage.backward_one_chunk = hooks.backward_one_chunk
    _ATTACHED[stage.stage_index] = runtime
    _install_wait_hook()
    return runtime
