"""Plans that offload activations to host memory (lynx_planner/offload.py says how the copy engine runs them).

heu-offload   HEU's plan, then its recomputation traded for offload where the host link carries it in time: layers
              that recompute (on demand first, spread evenly over the stage) keep everything and offload what HEU
              recomputed, as many as make the simulated iteration fastest within the memory limit; the rest is
              recomputed as HEU planned. Also HEU's plans for budgets above the limit (SHED_SHARES), brought back
              under it by offloading what their layers keep (spread evenly, as many as simulate fastest). The
              simulator picks.
offload       Megatron-core's fine-grained activation offloading as its docs advise: offload the modules with real
              recomputation cost (core_attn, attn_proj; expert_fc1 on MoE layers) and recompute the cheap ones
              (--recompute-modules layernorm moe_act), on its even split (`--offload-modules` picks others).
full-offload  torch's save_on_cpu / Transformer Engine's layer offload: every saved tensor of every transformer layer,
              its input included, goes to the host; nothing is recomputed.
All reload one layer ahead (layer_above), as Megatron and Transformer Engine prefetch.
"""

from __future__ import annotations

from dataclasses import replace

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


def _fastest(problem: Problem, bounds: list[int], pols: list[LayerPolicy], per_stage: list[list[int]], convert
             ) -> tuple[tuple, list[LayerPolicy]]:
    """((does not fit, simulated seconds, share), policies): the share of each stage's candidate layers (in order of
    preference) turned by `convert` that simulates fastest within the memory limit; ties go to converting less (the
    link's traffic and host memory are not free)."""
    profile = problem.profile

    def judge(fraction: float):
        ps = list(pols)
        for cands in per_stage:
            k = round(fraction * len(cands))
            for i in sorted(spread(cands[:k], k)) if k else []:
                ps[i] = convert(pols[i])
        e = evaluate(profile, stage_plans(profile, bounds, ps), ideal=False)
        return (not e.fits(problem.memory_limit), round(e.predicted.iteration_time_s, 9), fraction), ps

    most = max((len(c) for c in per_stage), default=0)
    if most == 0:
        return judge(0.0)
    steps = min(most, 16)
    scores = [judge(j / steps) for j in range(steps + 1)]
    best = min(range(steps + 1), key=lambda j: scores[j][0])
    if steps < most:  # refine between the neighbours of the best coarse point
        lo, hi = max(0, best - 1) / steps, min(steps, best + 1) / steps
        scores += [judge(lo + (hi - lo) * t / 8) for t in range(1, 8)]
    return min(scores, key=lambda x: x[0])


def _trade(problem: Problem, bounds: list[int], pols: list[LayerPolicy]) -> tuple[tuple, list[LayerPolicy]]:
    """HEU's policies with recomputing layers turned to offload (exposed recomputation first)."""
    per_stage = []
    for s in range(len(bounds) - 1):
        layers = [i for i in range(bounds[s], bounds[s + 1]) if pols[i].recompute]
        first = [i for i in layers if pols[i].at == "on_demand"]
        per_stage.append(spread(first, len(first)) + spread([i for i in layers if i not in first], len(layers)))
    return _fastest(problem, bounds, pols, per_stage, lambda p: offloaded_instead(problem.profile, p))


def offload_kept(profile: Profile, p: LayerPolicy) -> LayerPolicy:
    """Layer policy p with everything it keeps offloaded (its recomputation unchanged)."""
    info = policy.analyse(profile.blocks[p.block])
    off = [u for u in p.keep if u not in p.recompute and info.unit_bytes[u] > 0]
    return p.model_copy(update={"offload": off}) if off and p.recompute_with is None else p


def _shed(problem: Problem, bounds: list[int], pols: list[LayerPolicy], rep: str) -> tuple[tuple, list[LayerPolicy]]:
    """A plan HEU made for more memory than the limit, brought under it by offloading what layers keep (spread)."""
    per_stage = [spread(c, len(c)) for c in
                 ([i for i in range(bounds[s], bounds[s + 1]) if problem.profile.layers[i].block == rep]
                  for s in range(len(bounds) - 1))]
    return _fastest(problem, bounds, pols, per_stage, lambda p: offload_kept(problem.profile, p))


# HEU with offload also plans for more memory than there is and offloads its way back under the limit: budgets this
# share of the way from the limit to keeping everything, tried in turn while they get faster.
SHED_SHARES = (0.125, 0.25, 0.375, 0.5, 0.75)


def _heu_offload(problem: Problem, rep: str) -> Strategy:
    from . import heu

    base = heu.search(problem, "heu")
    best_key, best = _trade(problem, base.bounds, base.policies)
    best_bounds = base.bounds
    keep_all = evaluate(problem.profile, stage_plans(problem.profile, base.bounds, [
        none_policy(problem.profile, i) for i in range(len(problem.profile.layers))]), ideal=False).peak_bytes
    worse = 0
    for share in SHED_SHARES:
        more = replace(problem, memory_limit=int(problem.memory_limit + share * (keep_all - problem.memory_limit)))
        if more.memory_limit <= problem.memory_limit:
            break
        try:
            wide = heu.search(more, "heu")
        except Infeasible:
            break
        key, pols = _shed(problem, wide.bounds, wide.policies, rep)
        if key[:2] < best_key[:2]:
            best_key, best, best_bounds, worse = key, pols, wide.bounds, 0
        else:
            worse += 1
            if worse == 2:
                break
    return Strategy(best_bounds, best, status="heuristic")


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
        return _heu_offload(problem, rep)
    bounds = even_bounds(profile, n_chunks(profile))
    if algo == "full-offload":
        pols = [full_offload(profile, i) if profile.layers[i].block == rep else none_policy(profile, i)
                for i in range(n)]
    elif algo == "offload":
        pols = _megatron(problem, bounds, rep)
    else:
        raise Infeasible(f"unknown offload algorithm {algo!r}")
    return Strategy(bounds, pols, status="heuristic")
