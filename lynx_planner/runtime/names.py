"""Where a plan's layers and ops are in the user's module tree: known layer-name conventions (lynx's own,
torchtitan, Megatron, Hugging Face, the reference GPT) and, inside a block, a table of ops by role between the
Hugging Face and torchtitan Llama blocks.

A plan names its layers by module path (`StagePlan.layer_names`) in the convention of the model it was profiled
from: lynx's catalog (`embedding`, `layers.N`, `lm_head`), a Hugging Face model (`model.embed_tokens`,
`model.layers.N`, ...). `layer_paths` maps them by role (embedding, block N, final layers) onto the convention found
in the module given, or the one named by `names=`; `block_policy` maps a block's keep/recompute op ids by role (the
same GEMM, norm, attention, activation). Whatever has no counterpart is refused with a message naming it; the
exception is what needs no counterpart to behave the same: a layer the plan does not recompute, and an op the plan
recomputes (an op not kept is recomputed anyway).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..io import load_model
from ..layouts import CONVENTIONS, Convention, plan_convention, role
from ..opid import split_id, split_use
from ..schema import LayerPolicy, Plan
from .errors import PlanMismatchError
from .stages import layer_policies


def module_convention(module: nn.Module) -> tuple[Convention, str] | None:
    """(convention, prefix) whose blocks and embedding both exist in `module` (prefix: e.g. 'model.' for a wrapper)."""
    found = dict(module.named_modules())
    for path, sub in found.items():
        if not isinstance(sub, (nn.ModuleList, nn.ModuleDict)):
            continue
        for conv in CONVENTIONS.values():
            if path == conv.blocks or path.endswith("." + conv.blocks):
                prefix = path[: len(path) - len(conv.blocks)]
                if prefix + conv.embedding in found and all(prefix + f in found for f in conv.final[-1:]):
                    return conv, prefix
    return None


def _tree(module: nn.Module, limit: int = 8) -> str:
    """The module's top paths, first block only: 'model', 'model.embed_tokens', 'model.layers', 'model.layers.0', ..."""
    def shown(path: str) -> bool:
        parts = path.split(".")
        digits = [i for i, p in enumerate(parts) if p.isdigit()]
        return bool(path) and len(parts) <= 3 and (not digits or (parts[digits[0]] == "0" and digits[0] == len(parts) - 1))
    names = [n for n, _ in module.named_modules() if shown(n)][:limit]
    return ", ".join(repr(n) for n in names) or "no submodules"


def layer_paths(module: nn.Module, plan: Plan, names: list[str], modes: list[str],
                convention: str | None = None) -> list[str | None]:
    """The module path of each of the stage's layers (`names`, their policies' `modes`); None: a layer the plan does
    not recompute and the module has no counterpart of (it is left alone)."""
    found = dict(module.named_modules())
    if convention is None and all(split_use(n)[0] in found for n in names):  # 'layers.0#1': a module's second use
        return list(names)
    source = plan_convention(plan)
    if convention is not None:
        if convention not in CONVENTIONS:
            raise PlanMismatchError(f"names={convention!r} is not a known convention: one of "
                                    f"{', '.join(CONVENTIONS)}")
        target = CONVENTIONS[convention]
        prefix = next((p[: len(p) - len(target.blocks)] for p in found
                       if p == target.blocks or p.endswith("." + target.blocks)), "")
    else:
        detected = module_convention(module)
        if detected is None:  # no known layout: the paths as the plan names them (resolve_layers says what is missing)
            return list(names)
        target, prefix = detected
    if source is None:
        raise PlanMismatchError(
            f"the plan's layers {', '.join(repr(n) for n in names[:3])} follow no known convention, and the module "
            f"does not have those paths (it has {_tree(module)})")
    if target == source and not prefix:  # the same layout: resolve_layers names the path that is missing
        return list(names)
    out: list[str | None] = []
    for name, mode in zip(names, modes):
        kind, k = role(source, name)  # type: ignore[misc]
        if kind == "block":
            path: str | None = f"{prefix}{target.blocks}.{k}"
        elif kind == "embedding":
            path = prefix + target.embedding
        elif kind == "final" and len(source.final) == len(target.final):
            path = prefix + target.final[k]
        elif target == source and prefix + name in found:  # a layer the convention does not name (GPT-2's
            path = prefix + name  # embedding dropout): the same layout, so the same path under the prefix
        else:
            path = None
        if path is not None and path not in found:
            raise PlanMismatchError(
                f"plan layer {name!r} ({source.name} layout) has no counterpart in the module as a {target.name} "
                f"layout: {path!r} is missing (the module has {_tree(module)}); pass names= the module's layout")
        if path is None and mode != "none":
            raise PlanMismatchError(
                f"plan layer {name!r} ({source.name} convention) recomputes ({mode}) but has no counterpart in the "
                f"module's {target.name} layout {', '.join(repr(prefix + f) for f in target.final)}")
        out.append(path)
    return out


def stage_of(module: nn.Module, plan: Plan | str | Path, names: str | None = None) -> int:
    """The plan's stage whose layers `module`, one pipeline model part, holds (a pipeline split keeps the model's
    paths, `layers.N`, and drops the rest). With virtual stages a rank holds several parts, chunks rank, rank + pp,
    ...: the plan's stages are those chunks, so the pipeline rank alone does not name a part's stage."""
    if not isinstance(plan, Plan):
        plan = load_model(plan, Plan)
    found = dict(module.named_modules())
    for st in plan.stages:
        modes = [p.mode for p in layer_policies(st)]
        try:
            paths = layer_paths(module, plan, st.layer_names, modes, names)
        except PlanMismatchError:
            continue
        if all(p is None or p in found for p in paths) and any(p is not None for p in paths):
            return st.stage
    raise PlanMismatchError(f"no stage of the plan has its layers in this model part (it has e.g. "
                            f"{', '.join(n for n in list(found)[1:6])})")


# Ops of a Llama block by role: Hugging Face's LlamaDecoderLayer (as lynx's profiler records it) and torchtitan
# 0.3's Llama3TransformerBlock, with fp32 weights and with low-precision ones (bf16/fp16: model.to(dtype), or FSDP's
# param_dtype; the plan's ids say which, its norms' upcasts being saved units). Roles absent from one side (HF's
# rotate_half intermediates, torchtitan's qkv clones) have no counterpart. torchtitan's fused QKV projection is one
# GEMM for the three roles q, k, v.
def _norm_roles(role: str, hf: str, tt: str, cast: bool) -> dict[str, tuple[str, str]]:
    """An RMSNorm's ops by role. In low precision both upcast the input and cast back, in another order: HF casts the
    normalized input back before the weight product (mul#1 is its output), torchtitan after it (_to_copy#1)."""
    ops = {op: (f"{hf}:{op}", f"{tt}:{op}") for op in ("pow#0", "mean#0", "rsqrt#0", "mul#0")}
    ops["eps"] = (f"{hf}:add#0", f"{tt}:add_#0")
    if cast:  # later entries win from torchtitan to HF: its fp32 mul#0 is what HF's weight product reads cast back
        ops |= {"upcast": (f"{hf}:_to_copy#0", f"{tt}:_to_copy#0"),
                "weighted_input": (f"{hf}:_to_copy#1", f"{tt}:mul#0"), "out": (f"{hf}:mul#1", f"{tt}:_to_copy#1")}
    else:
        ops["out"] = (f"{hf}:mul#1", f"{tt}:mul#1")
    return {f"{role}.{k}": pair for k, pair in ops.items()}


def _llama_roles(cast: bool) -> dict[str, tuple[str, str]]:
    rope = ("attention.rope:_to_copy#2", "attention.rope:_to_copy#3") if cast else \
        ("attention.rope:mul#0", "attention.rope:mul#1")  # torchtitan's rotated q, k (cast back in low precision)
    return {
        **_norm_roles("attn_norm", "input_layernorm", "attention_norm", cast),
        **_norm_roles("ffn_norm", "post_attention_layernorm", "ffn_norm", cast),
        "q": ("self_attn.q_proj:mm#0", "attention.qkv_linear.wq:mm#0"),
        "k": ("self_attn.k_proj:mm#0", "attention.qkv_linear.wk:mm#0"),
        "v": ("self_attn.v_proj:mm#0", "attention.qkv_linear.wv:mm#0"),
        "q_rotated": ("self_attn:add#0", rope[0]),
        "k_rotated": ("self_attn:add#1", rope[1]),
        "attention": ("self_attn:_scaled_dot_product_flash_attention#0",
                      "attention.inner_attention:_scaled_dot_product_flash_attention#0"),
        "attention_math": ("self_attn:_scaled_dot_product_attention_math#0",
                           "attention.inner_attention:_scaled_dot_product_attention_math#0"),
        "o": ("self_attn.o_proj:mm#0", "attention.wo:mm#0"),
        "residual1": (":add#0", ":add#0"),
        "gate": ("mlp.gate_proj:mm#0", "feed_forward.w1:mm#0"),
        "act": ("mlp.act_fn:silu#0", "feed_forward:silu#0"),
        "up": ("mlp.up_proj:mm#0", "feed_forward.w3:mm#0"),
        "gated": ("mlp:mul#0", "feed_forward:mul#0"),
        "down": ("mlp.down_proj:mm#0", "feed_forward.w2:mm#0"),
        "residual2": (":add#1", ":add#1"),
    }


_LLAMA_ROLES, _LLAMA_ROLES_CAST = _llama_roles(cast=False), _llama_roles(cast=True)
_FUSED_QKV = "attention.qkv_linear.wqkv:mm#0"
# A block's op convention, told by submodules only it has.
_OP_CONVENTIONS = {"hf": ("self_attn.q_proj", "mlp.gate_proj"), "torchtitan": ("attention.wo", "feed_forward.w1")}


def block_ops(module: nn.Module) -> str | None:
    """'hf' or 'torchtitan' for a Llama block of that library, else None (lynx's own or unknown: ids as recorded)."""
    found = {n for n, _ in module.named_modules()}
    return next((k for k, marks in _OP_CONVENTIONS.items() if all(m in found for m in marks)), None)


def _ops_of(policy: LayerPolicy) -> str | None:
    modules = {split_id(op)[0] for op in (*policy.keep, *policy.recompute)}
    return next((k for k, marks in _OP_CONVENTIONS.items() if any(m in modules for m in marks)), None)


def layer_policy(policy: LayerPolicy, module: nn.Module, name: str, path: str) -> LayerPolicy:
    """The policy of plan layer `name` for the module at `path`: a full recomputation of a layer found under another
    name drops its op list (it recomputes the whole layer, whose op ids follow the other layout); blocks' op ids are
    translated by `block_policy`, a final RMSNorm's between HF and torchtitan by role."""
    if name != path and policy.mode == "full":
        return policy.model_copy(update={"keep": [], "recompute": []})
    sides = _final_norm_sides(name, module)
    if name != path and policy.mode == "selective" and sides is not None:
        src, dst = sides
        roles = _norm_roles("final", "", "", _low_precision(policy)).values()
        return _translate(policy, {pair[src]: pair[dst] for pair in roles}, module, path, ("hf", "torchtitan")[dst])
    return block_policy(policy, module, path)


def _final_norm_sides(name: str, module: nn.Module) -> tuple[int, int] | None:
    """(plan side, module side) of the norm table (0: HF, 1: torchtitan) when plan layer `name` is one library's final
    norm and `module` the other's RMSNorm, else None."""
    src = next((i for i, conv in enumerate(("hf", "torchtitan")) if role(CONVENTIONS[conv], name) == ("final", 0)),
               None)
    dst = 0 if hasattr(module, "variance_epsilon") else 1 if isinstance(module, nn.RMSNorm) else None
    return (src, dst) if src is not None and dst is not None and src != dst else None


def _low_precision(policy: LayerPolicy) -> bool:
    """The plan was made for low-precision weights: its ids name casts (a norm's fp32 upcast is a saved unit, so a
    selective policy keeps or recomputes it). The plan decides, not the module: FSDP casts weights after apply_plan."""
    return any(split_id(op)[1] == "_to_copy" for op in (*policy.keep, *policy.recompute))


def block_policy(policy: LayerPolicy, module: nn.Module, path: str) -> LayerPolicy:
    """The policy with its op ids in the convention of the block `module` (unchanged where they already are)."""
    source, target = _ops_of(policy), block_ops(module)
    # Only between the two Llama blocks lynx has a table of; any other block keeps the ids as recorded (the first
    # training forward refuses ids the block never runs): OPT, Phi, GPT-2 share HF module names like self_attn.q_proj
    if source is None or target is None or source == target or policy.mode == "none":
        return policy
    if policy.mode == "full":  # everything is recomputed: the op list only describes it
        return policy.model_copy(update={"keep": [], "recompute": []})
    src, dst = (0, 1) if source == "hf" else (1, 0)
    fused = dst == 1 and _FUSED_QKV.split(":")[0] in {n for n, _ in module.named_modules()}
    roles = _LLAMA_ROLES_CAST if _low_precision(policy) else _LLAMA_ROLES
    table = {pair[src]: pair[dst] for pair in roles.values()}
    if fused:
        table.update({roles[r][0]: _FUSED_QKV for r in ("q", "k", "v")})
    if src == 1:
        table[_FUSED_QKV] = roles["q"][0]  # the fused GEMM's output holds q, k and v: keep all three
    if fused:
        kept = {r for r in ("q", "k", "v") if roles[r][0] in policy.keep}
        if kept and len(kept) < 3:
            raise PlanMismatchError(
                f"layer {path!r}: the plan keeps the {', '.join(sorted(kept))} projection(s) but not all of q, k, v, "
                f"which torchtitan computes in one GEMM ({_FUSED_QKV.split(':')[0]}); build the model with "
                "fuse_qkv=False or re-plan from a profile of this model")
    return _translate(policy, table, module, path, target)


def _translate(policy: LayerPolicy, table: dict[str, str], module: nn.Module, path: str, target: str) -> LayerPolicy:
    """The policy's ids through `table`: every kept op needs a counterpart (else refused, naming it); a recomputed op
    without one is dropped (an op not kept is recomputed anyway)."""
    keep: list[str] = []
    for op in policy.keep:
        if op not in table:
            raise PlanMismatchError(
                f"layer {path!r}: the plan keeps {op!r}, which has no counterpart in {target}'s "
                f"{type(module).__name__}; re-plan from a profile of this model (lynx profile)")
        keep.append(table[op])
    recompute = [table[op] for op in policy.recompute if op in table and table[op] not in keep]
    return policy.model_copy(update={"keep": list(dict.fromkeys(keep)),
                                     "recompute": list(dict.fromkeys(recompute))})


__all__ = ["CONVENTIONS", "Convention", "block_ops", "block_policy", "layer_paths", "layer_policy", "module_convention",
           "plan_convention", "stage_of"]
