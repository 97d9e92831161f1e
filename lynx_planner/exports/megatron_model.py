"""The Megatron-LM flags that build the profiled model (megatron/training/arguments.py and TransformerConfig's
fields, megatron-core 0.19): sizes, norm, activation, positions (partial rotary), attention (GQA, MLA, q/k norms,
an output gate, Gated DeltaNet layers (its experimental attention variant),
sliding windows and their per-layer pattern, softmax sinks), biases, tied or untied output, vocabulary, MoE
(experts, router, shared experts, dense layers), multi-token-prediction modules — or an InputError naming what
Megatron cannot build (post-norms, tanh GeGLU, chunked attention, ...), so that an export never prints a different
model.

The model is the profile's recorded architecture (schema.ModelInfo.architecture: the ModelSpec it was built from).
The Megatron GPT (family 'gpt') is Megatron's default model: its flags are the sizes only (export.py).
"""

from __future__ import annotations

from ..io import InputError
from . import architecture
from ..models.spec import ModelSpec
from ..schema import ParallelConfig, Profile

# The families whose Hugging Face modules Megatron's GPTModel builds from the ModelSpec's fields, with the flags of
# what a family's module does beyond them: gpt-oss's gated MLP is x * sigmoid(1.702 x) on the gate times the linear
# half plus one (Megatron's quick GeGLU with a linear offset; its clamp is the spec's swiglu_limit).
FAMILIES: dict[str, tuple[str, ...]] = {
    **{f: () for f in ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3",
                       "deepseek_v2", "phi3", "glm4_moe")},
    "gpt_oss": ("--quick-geglu", "--glu-linear-offset 1.0"),
    # Qwen3-Next's RMSNorms scale by (1 + weight): Megatron's zero-centred gamma
    "qwen3_next": ("--swiglu", "--apply-layernorm-1p"),
}
# What the other families' modules do that Megatron-core 0.19's GPTModel does not build (checked after the model's
# own fields, which name most of it: post-norms, GeGLU, chunked attention).
NOT_BUILT = {
    "gemma3_text": "Gemma's (1 + weight) RMSNorm, embedding scaled by sqrt(hidden) and query_pre_attn_scalar",
    "olmo2": "OLMo 2's post-norms",
    "llama4_text": "Llama 4's chunked attention and router weighting the expert inputs",
}
# ModelSpec fields these flags express; any other field set in a profile's architecture is refused (a field added
# for a new feature must get its flag here before its models export).
HANDLED = {"schema_version", "name", "source", "family", "num_layers", "hidden", "heads", "kv_heads", "head_dim",
           "ffn_hidden", "vocab", "norm", "mlp", "positions", "tie_embeddings", "qkv_bias", "qk_norm", "mla", "moe",
           "rope_theta", "norm_eps", "layer_types", "window", "attention_sinks", "o_bias", "mlp_bias",
           "rotary_fraction", "mtp_layers", "swiglu_limit", "attn_output_gate", "linear_attention", "linear_layers",
           "notes"}  # notes: what lynx approximated, not a model field
MOE_HANDLED = {"experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn", "shared_gate", "dense_layers",
               "step", "dense_ids", "bias", "norm_topk_prob", "scoring", "n_group", "topk_group", "scaling"}


def _refuse(where: str, what: str) -> InputError:
    return InputError(f"{where}: field model.architecture.{what}; not exporting a different model")


def not_built(spec: ModelSpec, where: str) -> None:
    """An InputError naming the first feature of `spec` Megatron-core 0.19's GPTModel cannot build."""
    if spec.norm_layout != "pre":
        raise _refuse(where, f"norm_layout: {spec.norm_layout!r} (norms after attention and MLP): Megatron's "
                      "transformer layer norms only before them")
    if spec.mlp == "geglu":
        raise _refuse(where, "mlp: 'geglu' (the tanh GeLU gating the MLP): Megatron's gated GeLU is --quick-geglu, "
                      "x * sigmoid(1.702 x)")
    if spec.qk_norm and spec.qk_norm_scope == "all":
        raise _refuse(where, "qk_norm_scope: 'all' (one norm over all heads' q and k): Megatron's --qk-layernorm "
                      "norms each head")
    if spec.layer_types is not None and "chunked" in spec.layer_types:
        raise _refuse(where, f"layer_types: 'chunked' (attention within chunks of {spec.chunk} tokens): "
                      "Megatron-core 0.19 has no chunked attention")
    if spec.family in NOT_BUILT:
        raise _refuse(where, f"family: {spec.family!r}: Megatron-core 0.19's GPTModel does not build "
                      f"{NOT_BUILT[spec.family]}")
    if spec.family not in FAMILIES:
        raise _refuse(where, f"family: lynx knows no Megatron-LM flags that build a {spec.family!r} model")
    if (spec.norm, spec.mlp, spec.positions) != ("rmsnorm", "swiglu", "rotary"):
        raise _refuse(where, f"norm, mlp, positions: a {spec.family} model with {spec.norm}, {spec.mlp}, "
                      f"{spec.positions} positions: lynx exports only RMSNorm, gated-MLP, rotary decoders to Megatron")
    m = spec.moe
    if m is not None and m.scoring == "softmax" and (m.n_group or 1) > 1:
        raise _refuse(where, f"moe.n_group: {m.n_group} (group-limited softmax routing, groups ranked by their best "
                      "expert): Megatron ranks groups by the sum of their top-(k / groups) scores (DeepSeek-V3's)")
    biased = _biases(spec)
    if any(biased.values()) and not all(biased.values()):
        raise _refuse(where, "o_bias, mlp_bias, moe.bias: biases on " + ", ".join(k for k, v in biased.items() if v)
                      + " but not on " + ", ".join(k for k, v in biased.items() if not v) + ": Megatron's "
                      "--add-bias-linear biases every linear layer (--add-qkv-bias: q, k, v only)")


def _biases(spec: ModelSpec) -> dict[str, bool]:
    """Whether each kind of linear layer the model has (beyond q, k, v) carries biases: Megatron's --add-bias-linear
    puts them on all (attention, MLP, router, experts, shared experts), so an export needs all or none (q/k/v's
    biased with the others)."""
    out = {"attention output": spec.o_bias}
    if spec.mla is not None:
        out["MLA's projections"] = False
    if spec.o_bias:
        out["q, k, v"] = spec.qkv_bias
    if any(not spec.is_moe_layer(i) for i in range(spec.num_layers)):
        out["dense MLP"] = spec.mlp_bias
    m = spec.moe
    if m is not None:
        out["router and experts"] = m.bias
        if m.shared_ffn:
            out["shared experts"] = False
    return out


def spec_of(profile: Profile, where: str) -> ModelSpec | None:
    """The profiled model (architecture.spec_of), refused where it has a feature Megatron does not build or a field
    these flags do not express."""
    spec = architecture.spec_of(profile, where)
    if spec is not None and spec.family != "gpt":
        not_built(spec, where)
        architecture.unknown_fields(profile, HANDLED, MOE_HANDLED, "Megatron-LM", where)
    return spec


def pattern(bits: list[int]) -> str:
    """A list expression Megatron's parser evaluates to `bits` (arguments.py's _eval_pattern): the runs of the
    shortest repeating period, times its repeats ([0,0,0,1,1] -> ([0]*3+[1]*2), [1,0]*18 -> ([1]*1+[0]*1)*18)."""
    n = len(bits)
    period = next(p for p in range(1, n + 1) if n % p == 0 and bits == bits[:p] * (n // p))
    runs: list[list[int]] = []
    for b in bits[:period]:
        if runs and runs[-1][0] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    body = "(" + "+".join(f"[{b}]*{k}" for b, k in runs) + ")"
    return body + (f"*{n // period}" if n > period else "")


def vocab_divisor(vocab: int, tp: int) -> int:
    """The largest power of two up to Megatron's default 128 with which Megatron pads the vocabulary to itself:
    Megatron pads to a multiple of make_vocab_size_divisible_by x tp."""
    d = 128
    while vocab % (d * tp):
        d //= 2
    return d


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def model_flags(spec: ModelSpec, par: ParallelConfig, where: str) -> list[str]:
    """Megatron-LM's flags for a Hugging Face decoder family's model (not the GPT family: Megatron's default), which
    spec_of has checked Megatron builds."""
    not_built(spec, where)
    flags = [f"--num-layers {spec.num_layers}", f"--hidden-size {spec.hidden}",
             f"--num-attention-heads {spec.heads}", f"--ffn-hidden-size {spec.ffn_hidden}",
             "--normalization RMSNorm"]
    if spec.norm_eps is not None:
        flags.append(f"--norm-epsilon {_number(spec.norm_eps)}")
    flags += list(FAMILIES[spec.family]) or ["--swiglu"]
    if spec.swiglu_limit is not None:
        flags.append(f"--activation-func-clamp-value {_number(spec.swiglu_limit)}")
    if not spec.o_bias:  # Megatron biases every linear layer unless told not to (not_built: all or none)
        flags.append("--disable-bias-linear")
    flags.append("--position-embedding-type rope")
    if spec.rope_theta is not None:
        flags.append(f"--rotary-base {_number(spec.rope_theta)}")
    if spec.rotary_fraction != 1.0:
        flags.append(f"--rotary-percent {_number(spec.rotary_fraction)}")
    if spec.mla is None:
        flags.append(f"--kv-channels {spec.dim}")
        if spec.kv != spec.heads:
            flags += ["--group-query-attention", f"--num-query-groups {spec.kv}"]
    else:
        m = spec.mla
        # plain rotary (the architecture records no YaRN scaling); Megatron fuses MLA's rotary only for YaRN
        flags += ["--multi-latent-attention", "--rope-type rope", "--no-rope-fusion"]
        if m.q_lora_rank is not None:
            flags.append(f"--q-lora-rank {m.q_lora_rank}")
        flags += [f"--kv-lora-rank {m.kv_lora_rank}", f"--qk-head-dim {m.qk_nope_head_dim}",
                  f"--qk-pos-emb-head-dim {m.qk_rope_head_dim}", f"--v-head-dim {m.v_head_dim}"]
    if spec.qkv_bias and not spec.o_bias:  # Megatron's linear biases include q, k, v's
        flags.append("--add-qkv-bias")
    if spec.qk_norm:
        flags.append("--qk-layernorm")
    if spec.attn_output_gate:
        flags.append("--attention-output-gate")
    flags += linear_attention_flags(spec)
    flags += window_flags(spec)
    if spec.attention_sinks:
        flags.append("--softmax-type learnable")  # a learned logit per head in each softmax
    if not spec.tie_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    flags += [f"--vocab-size {spec.vocab}", f"--make-vocab-size-divisible-by {vocab_divisor(spec.vocab, par.tp)}",
              "--attention-dropout 0.0", "--hidden-dropout 0.0"]  # the families train without dropout
    if spec.moe is not None:
        flags += moe_flags(spec, where)
    if spec.mtp_layers:  # each a decoder layer like the last, sharing the embedding and output layer
        flags.append(f"--mtp-num-layers {spec.mtp_layers}")
    return flags


def linear_attention_flags(spec: ModelSpec) -> list[str]:
    """Gated DeltaNet layers (Megatron-core's experimental attention variant `gated_delta_net`): their sizes and
    which layers they are (--linear-attention-freq: 1 a linear-attention layer, 0 softmax attention)."""
    g = spec.linear_attention
    if g is None:
        return []
    bits = [int(i in spec.linear_layers) for i in range(spec.num_layers)]
    return ["--experimental-attention-variant gated_delta_net", f'--linear-attention-freq "{pattern(bits)}"',
            f"--linear-conv-kernel-dim {g.conv_kernel}", f"--linear-key-head-dim {g.key_head_dim}",
            f"--linear-value-head-dim {g.value_head_dim}", f"--linear-num-key-heads {g.key_heads}",
            f"--linear-num-value-heads {g.value_heads}"]


def window_flags(spec: ModelSpec) -> list[str]:
    """Sliding-window attention: Megatron's window (left, right) attends to the `left` keys before a query and
    itself (`window` keys in all, as transformers' sliding_window), on every layer or on those of the pattern (1:
    window, 0: full attention)."""
    if spec.layer_types is None or "sliding" not in spec.layer_types:
        return []
    flags = [f'--window-size "({spec.window - 1},0)"']
    bits = [int(k == "sliding") for k in spec.layer_types]
    if not all(bits):
        flags.append(f'--window-attn-skip-freq "{pattern(bits)}"')
    return flags


def expert_flags(spec: ModelSpec | None, par: ParallelConfig) -> tuple[list[str], list[str]]:
    """(flags, notes) of expert parallelism: lynx's EP (Megatron's) shards the experts over `ep` ranks with expert
    TP inside each. Megatron builds expert biases (gpt-oss) only without expert TP: there each expert is whole on
    one of ep x tp ranks, the same expert bytes per rank."""
    m = spec.moe if spec is not None else None
    if m is not None and m.bias and par.tp > 1:
        return ([f"--expert-model-parallel-size {par.ep * par.tp}", "--expert-tensor-parallel-size 1"],
                [f"Megatron builds expert biases only without expert TP: each expert whole over ep {par.ep} x tp "
                 f"{par.tp} = {par.ep * par.tp} ranks (the same expert bytes per rank); the plan prices the tokens' "
                 f"all-to-all over {par.ep} ranks, these flags run it over {par.ep * par.tp}"])
    return ([f"--expert-model-parallel-size {par.ep}"] if par.ep > 1 else []), []


def attention_backend(spec: ModelSpec | None) -> str:
    """Megatron's --attention-backend for lynx's fused attention core: TE's flash attention, or its cuDNN fused
    attention where the softmax has sinks (TE's flash-attention backend has none)."""
    return "fused" if spec is not None and spec.attention_sinks else "flash"


def kernel_flags(profile: Profile) -> tuple[list[str], list[str]]:
    """(flags, notes) of the kernels the profile priced: Megatron runs Transformer Engine's; `--kernels te --fp8` is
    its fp8 recipe (e4m3 forward, e5m2 gradients: `hybrid`). A profile of Hugging Face's eager kernels prices more
    saved bytes than these flags' run holds: a note says so."""
    if profile.kernels == "te":
        return ["--transformer-impl transformer_engine"] + (["--fp8-format hybrid"] if profile.fp8 else []), []
    which = {"hf": "Hugging Face's eager kernels", "torchtitan": "torchtitan's eager Llama block"}[profile.kernels]
    return [], [f"the profile prices {which} (fp32 norm copies, unfused SwiGLU and rotary); Megatron-core with "
                "Transformer Engine saves less per layer: profile with --kernels te to price the run these flags "
                "start"]


def moe_flags(spec: ModelSpec, where: str) -> list[str]:
    m = spec.moe
    assert m is not None
    flags = [f"--num-experts {m.experts}", f"--moe-router-topk {m.top_k}", f"--moe-ffn-hidden-size {m.expert_ffn}"]
    if m.shared_ffn:
        flags.append(f"--moe-shared-expert-intermediate-size {m.shared_ffn}")
    if m.shared_gate:
        flags.append("--moe-shared-expert-gate")
    bits = [int(spec.is_moe_layer(i)) for i in range(spec.num_layers)]
    if not all(bits):  # dense layers (DeepSeek's first k, Qwen-MoE's step and mlp_only_layers): 0
        flags.append(f'--moe-layer-freq "{pattern(bits)}"')
    if m.scoring == "sigmoid":
        if not m.norm_topk_prob:
            raise InputError(f"{where}: field model.architecture.moe.norm_topk_prob: false with sigmoid scores: "
                             "Megatron's sigmoid router always renormalises its top-k weights")
        flags += ["--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias"]
    elif not m.norm_topk_prob:
        flags.append("--moe-router-pre-softmax")  # softmax over all experts, then top-k, not renormalised
    if m.groups > 1:
        flags += [f"--moe-router-num-groups {m.groups}", f"--moe-router-group-topk {m.group_topk}"]
    if m.scaling != 1.0:
        flags.append(f"--moe-router-topk-scaling-factor {_number(m.scaling)}")
    return flags

