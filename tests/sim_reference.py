"""The simulator's timeline as it was written before its fast paths (issue 15): a straightforward reference that
tests/test_simulator_fast.py compares the fast simulator with, result for result. Every rank is visited in every pass,
every layer goes through the general path, and nothing is cached between simulations.
"""

from __future__ import annotations

import bisect

from lynx_planner import placements, schedules, simulator
from lynx_planner.schema import Profile
from lynx_planner.simulator import (EPS, LayerRun, SimResult, StageResult, _Task, backward_deadlines, boundary_bytes,
                                    reduce_gradients)


class _Chunk:
    """What the timeline needs of one virtual stage's layers."""

    def __init__(self, runs: list[LayerRun]):
        self.runs = runs
        n = len(runs)
        self.recomputes = [(r.rec_s > 0 or r.rec_bytes > 0) and r.trigger is None for r in runs]
        self.by_at = {at: [l for l in range(n) if runs[l].at == at and self.recomputes[l]]
                      for at in ("grad_wait", "prev_forward", "layer_above")}
        self.chunk = {m: [l for l in range(n) if runs[l].trigger == m] for m in range(n)}
        # (busy, idle) seconds of each layer's forward and backward: the fast path when nothing is queued
        self.fwd_sums = [(sum(r.fwd[0::2]), sum(r.fwd[1::2])) for r in runs]
        self.bwd_sums = [(sum(r.bwd[0::2]), sum(r.bwd[1::2])) for r in runs]
        self.bwd_input_sums = [(sum(r.bwd_input[0::2]), sum(r.bwd_input[1::2])) for r in runs]
        self.grad_waits: list[float] = []


class _Stage:
    """The compute and side streams and the memory timeline of one rank (its chunks share them)."""

    def __init__(self, s: int, chunks: dict[int, list[LayerRun]], gamma: float, trace: list | None,
                 deadline: dict[tuple[int, int], int], split: bool):
        self.s, self.gamma, self.trace, self.deadline, self.split = s, gamma, trace, deadline, split
        self.chunks = {c: _Chunk(runs) for c, runs in chunks.items()}
        # (micro-batch, global layer) -> (trigger, action) that released its recomputation; kept when tracing
        self.released: dict[tuple[int, int], tuple[str, tuple[str, int]]] = {}
        self.t = 0.0
        self.queue: list[_Task] = []
        self.tasks: dict[tuple[int, int, int], _Task] = {}
        self.mem: list[tuple[float, int]] = []
        self.busy = self.exposed = self.hidden = 0.0
        self.grad_waits: list[float] = []

    def _event(self, stream: str, name: str, start: float, dur: float) -> None:
        if self.trace is not None and dur > 0:
            self.trace.append({"name": name, "ph": "X", "pid": self.s, "tid": stream,
                               "ts": start * 1e6, "dur": dur * 1e6})

    def _log(self, c: int, k: int, l: int, trigger: str, action: tuple[str, int]) -> None:
        if self.trace is not None:
            self.released[(k, self.chunks[c].runs[l].index)] = (trigger, action)

    def release(self, c: int, k: int, l: int, trigger: str, action: tuple[str, int]) -> None:
        self._log(c, k, l, trigger, action)
        r = self.chunks[c].runs[l]
        task = _Task(r.rec_s, (self.deadline[(c, k)], -l), r.rec_bytes, c, l, k)
        self.tasks[(c, k, l)] = task
        bisect.insort(self.queue, task, key=lambda x: x.key)  # earliest deadline first

    def idle(self, until: float) -> None:
        """The compute stream waits until `until`; the side stream recomputes meanwhile."""
        cur = self.t
        if not self.queue:
            self.t = max(cur, until)
            return
        cap = (until - cur) / self.gamma
        while cap > EPS and self.queue:
            task = self.queue[0]
            if not task.started:
                task.started = True
                self.mem.append((cur, task.nbytes))
            work = min(task.rem, cap)
            task.rem -= work
            cap -= work
            self.hidden += work
            if self.trace is not None:
                self._event("recompute (side)", f"R mb{task.mb} L{self.chunks[task.chunk].runs[task.layer].index}", cur,
                            work * self.gamma)
            cur += work * self.gamma
            if task.rem <= EPS:
                self.queue.pop(0)
        self.t = max(self.t, until)

    def _segments(self, segs: tuple[float, ...], sums: tuple[float, float], action: str, k: int, index: int) -> None:
        if not self.queue and self.trace is None:  # nothing to recompute in the idle parts: skip through
            self.busy += sums[0]
            self.t += sums[0] + sums[1]
            return
        tracing = self.trace is not None
        name = f"{action} mb{k} L{index}" if tracing else ""
        for i, dt in enumerate(segs):
            if i % 2 == 0:
                if tracing:
                    self._event("compute", name, self.t, dt)
                self.t += dt
                self.busy += dt
            elif dt > 0:
                if tracing:
                    self._event("tp collective", name, self.t, dt)
                self.idle(self.t + dt)

    def _expose(self, k: int, index: int, work: float, nbytes: int, started: bool) -> None:
        if not started:
            self.mem.append((self.t, nbytes))
        if work > 0:
            if self.trace is not None:
                self._event("compute", f"R mb{k} L{index} (exposed)", self.t, work)
            self.t += work
            self.busy += work
            self.exposed += work

    def forward(self, c: int, k: int, ready: float, releases: tuple[int, int] | None) -> None:
        """F(c, k); at its start, after its input arrived, the prev_forward tasks of `releases` (chunk, micro-batch)
        are released."""
        self.idle(ready)
        if releases is not None:
            rc, rk = releases
            for l in self.chunks[rc].by_at["prev_forward"]:
                self.release(rc, rk, l, "prev_forward", ("F", k))
        ch = self.chunks[c]
        for l, r in enumerate(ch.runs):
            self._segments(r.fwd, ch.fwd_sums[l], "F", k, r.index)
            self.mem.append((self.t, r.kept_bytes))

    def backward(self, c: int, k: int, ready: float) -> None:
        ch = self.chunks[c]
        n = len(ch.runs)
        action = ("B", k)
        for l in ch.by_at["grad_wait"]:
            self.release(c, k, l, "grad_wait", action)
        if n - 1 in ch.by_at["layer_above"]:  # the top layer's layer above is the wait for the gradient
            self.release(c, k, n - 1, "grad_wait", action)
        wait = max(0.0, ready - self.t)
        self.grad_waits.append(wait)
        ch.grad_waits.append(wait)
        self.idle(ready)
        for l in range(n - 1, -1, -1):
            r = ch.runs[l]
            if l > 0 and l - 1 in ch.by_at["layer_above"]:
                self.release(c, k, l - 1, "layer_above", action)
            for u in ch.chunk[l]:  # Megatron uniform: the chunk top recomputes the whole chunk
                self._log(c, k, u, placements.ON_DEMAND, action)
                self._expose(k, ch.runs[u].index, ch.runs[u].rec_s, ch.runs[u].rec_bytes, False)
            task = self.tasks.pop((c, k, l), None)
            if task is not None:
                if task in self.queue:
                    self.queue.remove(task)
                self._expose(k, r.index, task.rem, task.nbytes, task.started)
            elif ch.recomputes[l]:  # on demand (or a prev_forward with no forward before this backward)
                self._log(c, k, l, placements.ON_DEMAND, action)
                self._expose(k, r.index, r.rec_s, r.rec_bytes, False)
            if r.bwd_transient:  # the loss's gradients, over the layer's backward (B)
                self.mem.append((self.t, r.bwd_transient))
            if self.split:  # the weight gradients wait for W: the layer's graph stays, with their output gradients
                self._segments(r.bwd_input, ch.bwd_input_sums[l], "B", k, r.index)
                self.mem.append((self.t, r.wgrad_bytes - r.bwd_transient))
            else:
                self._segments(r.bwd, ch.bwd_sums[l], "B", k, r.index)
                self.mem.append((self.t, -(r.kept_bytes + r.rec_bytes + r.bwd_transient)))

    def weight(self, c: int, k: int) -> None:
        """W(c, k): every layer's weight gradients, top down; then its graph is freed."""
        for r in reversed(self.chunks[c].runs):
            self._event("compute", f"W mb{k} L{r.index}", self.t, r.wgrad_s)
            self.t += r.wgrad_s
            self.busy += r.wgrad_s
            self.mem.append((self.t, -(r.kept_bytes + r.rec_bytes + r.wgrad_bytes)))

    def activation_peak(self) -> int:
        cur = peak = 0
        for _, delta in sorted(self.mem):  # frees before allocations at equal times
            cur += delta
            peak = max(peak, cur)
        return peak



def simulate(profile: Profile, stage_layers: list[list[LayerRun]], trace: bool = False) -> SimResult:
    """Simulate one iteration; `stage_layers[c]` are the layers of virtual stage c in order (pp x virtual_stages of
    them; rank c % pp runs chunk c)."""
    par, hw = profile.parallel, profile.hardware
    p, v, m = par.pp, par.virtual_stages, par.num_microbatches
    n_chunks = len(stage_layers)
    if n_chunks != p * v:
        raise ValueError(f"{n_chunks} virtual stages for pp {p} x {v} virtual stages")
    events: list[dict] | None = [] if trace else None
    split = schedules.get(par.schedule).splits_backward
    orders = [schedules.order(par.schedule, p, v, r, m) for r in range(p)]
    stages = []
    for r in range(p):
        stages.append(_Stage(r, {c: stage_layers[c] for c in schedules.chunks_of(p, v, r)}, hw.interference, events,
                             backward_deadlines(orders[r]), split))
    # a chunk's output goes to the next chunk's rank; none when both are on one rank (priced as the simulator does:
    # this reference is of the timeline, not of the link model)
    send = [0.0 if schedules.rank_of(p, c + 1) == schedules.rank_of(p, c) and c + 1 < n_chunks else
            simulator.send_s(profile, boundary_bytes(profile, runs[-1].index)) for c, runs in enumerate(stage_layers)]
    fires = [placements.prev_forward_fires(par.schedule, p, v, r, m) for r in range(p)]
    fwd_end = [[-1.0] * m for _ in range(n_chunks)]
    bwd_end = [[-1.0] * m for _ in range(n_chunks)]
    ptr = [0] * p
    remaining = sum(len(o) for o in orders)
    last = n_chunks - 1
    while remaining:
        progressed = False
        for s, st in enumerate(stages):
            order = orders[s]
            while ptr[s] < len(order):
                kind, c, k = order[ptr[s]]
                if kind == "F":
                    ready = 0.0 if c == 0 else fwd_end[c - 1][k] + send[c - 1] if fwd_end[c - 1][k] >= 0 else None
                elif kind == "B":
                    ready = (fwd_end[c][k] if c == last
                             else bwd_end[c + 1][k] + send[c] if bwd_end[c + 1][k] >= 0 else None)
                else:
                    ready = st.t  # W follows its own B on the same rank
                if ready is None:
                    break
                if kind == "F":
                    st.forward(c, k, ready, fires[s].get((c, k)))
                    fwd_end[c][k] = st.t
                elif kind == "B":
                    st.backward(c, k, ready)
                    bwd_end[c][k] = st.t
                else:
                    st.weight(c, k)
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked")
    results = [StageResult(st.activation_peak(), st.busy, st.exposed, st.hidden, st.t, st.grad_waits, bwd_end[s])
               for s, st in enumerate(stages)]
    rank_runs = [[run for c in schedules.chunks_of(p, v, r) for run in stage_layers[c]] for r in range(p)]
    reduce_gradients(profile, rank_runs, results, events)
    return SimResult(max(r.end_s for r in results), results, events or [], releases=[st.released for st in stages],
                     memory=[st.mem for st in stages] if trace else [],
                     chunk_grad_waits_s=[stages[schedules.rank_of(p, c)].chunks[c].grad_waits for c in range(n_chunks)])
