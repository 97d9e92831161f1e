"""Plans that offload activations to host memory (lynx_planner/offload.py says how the copy engine runs them).

heu-offload   HEU's plan, then its recomputation traded for offload where the host link carries it in time: layers
              that recompute (on demand first, spread evenly over the stage) keep everything and offload what HEU
              recomputed, as many as make the simulated iteration fastest within the memory limit; the rest is
              recomputed as HEU planned.
offload       Megatron-core's fine-grained activation offloading as its docs advise: offload the modules with real
              recomputation cost (core_attn, attn_proj; expert_fc1 on MoE layers) and recompute the cheap ones
              (--recompute-modules layernorm moe_act), on its even split (`--offload-modules` picks others).
full-offload  torch's save_on_cpu / Transformer Engine's layer offload: every saved tensor of every transformer layer,
              its input included, goes to the host; nothing is recomputed.
All reload one layer ahead (layer_above), as Megatron and Transformer Engine prefetch.
"""

from __future__ import annotations

from .. import offload, policy
from ..evaluate import evaluate, layer_policy, none_policy, stage_plans
from ..io import InputError
from ..schema import BLOCK_INPUT, LayerPolicy, Profile
from . import Infeasible, Problem, Strategy
from .partition import even_bounds, repeated_block
from .stage_model import n_chunks

DEFAULT_MODULES = ("core_attn", "attn_proj", "expert_fc1")  # offloaded: what costs real time to recompute
RECOMPUTE_MODULES = ("attn_norm", "mlp_norm", "moe_act")  # Megatron's --recompute-modules layernorm moe_act


def _need_link(profile: Profile) -> None:
    if offload.host_link(profile.hardware) is None:
        raise InputError(f"{profile.hardware.name}: no host link to offload to (a CPU rank, or hardware without "
                         "host_link fields: set them in the hardware file or run `lynx hardware calibrate`)")


def megatron_offload(profile: Profile, i: int, modules: tuple[str, ...],
                     recompute: tuple[str, ...] | None = RECOMPUTE_MODULES) -> LayerPolicy:
    """Layer i under Megatron's fine-grained offloading of `modules`, with the `recompute` modules recomputed
    (--recompute-modules; None: full recomputation, --recompute-granularity full)."""
    block = profile.blocks[profile.layers[i].block]
    info = policy.analyse(block)
    if recompute is None:
        p = layer_policy(profile, i, frozenset(), policy.full_recompute(info))
        keep: frozenset[str] = frozenset()
    else:
        cheap = offload.module_ops(block, recompute)
        keep = frozenset(u for u in info.units if u not in cheap)
        p = layer_policy(profile, i, keep)
    units, takes_input = offload.module_units(block, modules)
    off = [u for u in units if u in keep and info.unit_bytes[u] > 0] + ([BLOCK_INPUT] if takes_input else [])
    return p.model_copy(update={"offload": off})


def full_offload(profile: Profile, i: int) -> LayerPolicy:
    """Layer i keeping everything, all of it (the input too) offloaded."""
    p = none_policy(profile, i)
    info = policy.analyse(profile.blocks[p.block])
    return p.model_copy(update={"offload": [BLOCK_INPUT] + [u for u in p.keep if info.unit_bytes[u] > 0]})


def offloaded_instead(profile: Profile, p: LayerPolicy) -> LayerPolicy:
    """Layer policy p with its recomputation replaced by offload: keep all, offload what p did not keep."""
    i = p.layers[0]
    info = policy.analyse(profile.blocks[p.block])
    kept = set(p.keep)
    full = none_policy(profile, i)
    off = [u for u in full.keep if u not in kept and info.unit_bytes[u] > 0]
    if p.recompute_with is not None:  # a uniform chunk layer did not keep its input either
        off = [BLOCK_INPUT] + off
    return full.model_copy(update={"offload": off}) if off else p


def spread(items: list[int], n: int) -> list[int]:
    """n of `items`, evenly spaced (the copies of neighbouring layers queue on one link)."""
    if n <= 0:
        return []
    if n >= len(items):
        return list(items)
    return [items[(2 * j + 1) * len(items) // (2 * n)] for j in range(n)]


def _trade(problem: Problem, bounds: list[int], pols: list[LayerPolicy]) -> list[LayerPolicy]:
    """HEU's policies with the best number of recomputing layers per stage turned to offload (the simulator judges)."""
    profile = problem.profile
    per_stage = []
    for s in range(len(bounds) - 1):
        layers = [i for i in range(bounds[s], bounds[s + 1]) if pols[i].recompute]
        first = [i for i in layers if pols[i].at == "on_demand"]  # exposed recomputation first
        per_stage.append(spread(first, len(first)) + spread([i for i in layers if i not in first], len(layers)))

    def variant(fraction: float) -> list[LayerPolicy]:
        out = list(pols)
        for cands in per_stage:
            k = round(fraction * len(cands))
            for i in sorted(spread(cands[:k], k)) if k else []:
                out[i] = offloaded_instead(profile, pols[i])
        return out

    def judge(fraction: float):
        ps = variant(fraction)
        ev = evaluate(profile, stage_plans(profile, bounds, ps), ideal=False)
        # ties (within a nanosecond) go to offloading less: the link's traffic and host memory are not free
        return (not ev.fits(problem.memory_limit), round(ev.predicted.iteration_time_s, 9), fraction), ps

    most = max((len(c) for c in per_stage), default=0)
    if most == 0:
        return pols
    steps = min(most, 16)
    scores = {j: judge(j / steps) for j in range(steps + 1)}
    best = min(scores, key=lambda j: scores[j][0])
    if steps < most:  # refine between the neighbours of the best coarse point
        lo, hi = max(0, best - 1) / steps, min(steps, best + 1) / steps
        fine = {f: judge(f) for f in (lo + (hi - lo) * t / 8 for t in range(9))}
        f = min(fine, key=lambda x: fine[x][0])
        return fine[f][1] if fine[f][0] < scores[best][0] else scores[best][1]
    return scores[best][1]


# The settings a Megatron user tries in turn, as its docs advise (offload what is costly to recompute, recompute the
# cheap modules, calibrate the amount offloaded): more modules, then all of them, then full recomputation with the
# layer input offloaded (PR #5218). The fastest that fits the memory limit is the baseline.
LADDER: tuple[tuple[tuple[str, ...], tuple[str, ...] | None], ...] = (
    (("core_attn",), RECOMPUTE_MODULES),
    (("core_attn", "attn_proj"), RECOMPUTE_MODULES),
    (DEFAULT_MODULES, RECOMPUTE_MODULES),
    (("qkv_linear",) + DEFAULT_MODULES, RECOMPUTE_MODULES),
    (("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"), ()),
    (("layer_input",), None),  # None: full recomputation
)


def _megatron(problem: Problem, bounds: list[int], rep: str) -> list[LayerPolicy]:
    profile, n = problem.profile, len(problem.profile.layers)
    if problem.offload_modules:
        unknown = [m for m in problem.offload_modules if m not in offload.MODULES]
        if unknown:
            raise InputError(f"--offload-modules: unknown module {unknown[0]!r} (expected some of "
                             f"{', '.join(offload.MODULES)})")
        ladder = ((tuple(problem.offload_modules), RECOMPUTE_MODULES),)
    else:
        ladder = LADDER
    best = None
    for modules, recompute in ladder:
        pols = [megatron_offload(profile, i, modules, recompute) if profile.layers[i].block == rep
                else none_policy(profile, i) for i in range(n)]
        ev = evaluate(profile, stage_plans(profile, bounds, pols), ideal=False)
        key = (not ev.fits(problem.memory_limit), ev.predicted.iteration_time_s if ev.fits(problem.memory_limit)
               else ev.peak_bytes)
        if best is None or key < best[0]:
            best = (key, pols)
    return best[1]


def search(problem: Problem, algo: str) -> Strategy:
    profile = problem.profile
    _need_link(profile)
    rep = repeated_block(profile)
    n = len(profile.layers)
    if algo == "heu-offload":
        from . import heu

        base = heu.search(problem, "heu")
        return Strategy(base.bounds, _trade(problem, base.bounds, base.policies), status="heuristic")
    bounds = even_bounds(profile, n_chunks(profile))
    if algo == "full-offload":
        pols = [full_offload(profile, i) if profile.layers[i].block == rep else none_policy(profile, i)
                for i in range(n)]
    elif algo == "offload":
        pols = _megatron(problem, bounds, rep)
    else:
        raise Infeasible(f"unknown offload algorithm {algo!r}")
    return Strategy(bounds, pols, status="heuristic")
