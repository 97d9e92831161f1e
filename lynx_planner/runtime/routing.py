"""Layers whose routing decides which ops run (mixture of experts): which op ids a forward may skip, and one keep
policy shared by identical experts.

Experts are found in the layer's module tree: the children of a ModuleList/ModuleDict of identical modules (each
expert a module: its ops are named by expert, 'moe.experts.3.0:addmm#0'), or a module holding all experts' weights
that says how many it has (`num_experts` / `num_local_experts`, Hugging Face's fused experts: its loop names ops by
the order experts run, 'mlp.experts:mm#3'). The module that holds them runs the routing loop (indexing, weighting,
scatter per expert that received tokens). Ops in these modules run or not as the batch routes, and the occurrences of
a loop's ops follow the experts that ran; so a planned layer with experts may skip them, is recorded at every forward
(its keep decisions follow that forward's ops, see region.py), and keeps an expert's op when the plan keeps that op
in any identical expert (identical experts, one policy).
"""

from __future__ import annotations

from torch import nn

from ..opid import make_id, split_id


def _identical(children: list[nn.Module]) -> bool:
    def shape(m: nn.Module) -> tuple:
        return type(m), tuple((n, tuple(p.shape)) for n, p in m.named_parameters())
    return len(children) >= 2 and len({shape(c) for c in children}) == 1


def expert_lists(layer: nn.Module) -> dict[str, list[str]]:
    """{path of a container of identical experts (relative to the layer): its child names}."""
    out = {}
    for path, m in layer.named_modules():
        if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            names = [n for n, _ in m.named_children()]
            if _identical([c for _, c in m.named_children()]) and any(True for _ in m.parameters()):
                out[path] = names
    return out


def routed_paths(layer: nn.Module) -> tuple[str, ...]:
    """Module paths (relative to the layer) whose ops depend on the routing: expert containers, fused expert
    modules, and the modules holding them (the routing loop)."""
    found: set[str] = set()
    for path, m in layer.named_modules():
        fused = any(isinstance(getattr(m, a, None), int) for a in ("num_experts", "num_local_experts")) and \
            any(p.dim() == 3 for p in m.parameters(recurse=False))
        if fused or path in expert_lists(layer):
            found.add(path)
            found.add(path.rpartition(".")[0])
    return tuple(sorted(found))


def is_routed(op_id: str, paths: tuple[str, ...]) -> bool:
    path = split_id(op_id)[0]
    return any(path == p or path.startswith(f"{p}.") or p == "" for p in paths)


def shared_keep(keep: frozenset[str], layer: nn.Module) -> frozenset[str]:
    """The keep set with each expert's kept op kept in every identical expert of its container."""
    out = set(keep)
    for container, names in expert_lists(layer).items():
        prefix = f"{container}." if container else ""
        for op in keep:
            path, name, occurrence = split_id(op)
            expert, dot, sub = path[len(prefix):].partition(".") if path.startswith(prefix) else ("", "", "")
            if expert in names:
                out.update(make_id(f"{prefix}{n}{dot}{sub}", name, occurrence) for n in names)
    return frozenset(out)
