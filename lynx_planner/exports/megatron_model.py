"""The Megatron-LM flags that build the profiled model (megatron/training/arguments.py and TransformerConfig's
fields, megatron-core 0.19): sizes, norm, activation, positions, attention (GQA, MLA), biases, tied or untied
output, vocabulary, MoE (experts, router, shared experts, dense layers) — or an InputError naming what Megatron
cannot build, so that an export never prints a different model.

The model is the profile's recorded architecture (schema.ModelInfo.architecture: the ModelSpec it was built from).
The Megatron GPT (family 'gpt') is Megatron's default model: its flags are the sizes only (export.py).
"""

from __future__ import annotations

from ..io import InputError
from . import architecture
from ..models.spec import ModelSpec
from ..schema import ParallelConfig, Profile

# The families whose Hugging Face modules Megatron's GPTModel builds with the flags below.
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
# ModelSpec fields these flags express; any other field set in a profile's architecture is refused (a field added
# for a new feature must get its flag here before its models export).
HANDLED = {"schema_version", "name", "source", "family", "num_layers", "hidden", "heads", "kv_heads", "head_dim",
           "ffn_hidden", "vocab", "norm", "mlp", "positions", "tie_embeddings", "qkv_bias", "qk_norm", "mla", "moe",
           "rope_theta", "norm_eps", "notes"}  # notes: what lynx approximated, not a model field
MOE_HANDLED = {"experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn", "shared_gate", "dense_layers",
               "norm_topk_prob", "scoring", "n_group", "topk_group", "scaling"}


def spec_of(profile: Profile, where: str) -> ModelSpec | None:
    """The profiled model (architecture.spec_of), refused where it has a field these flags do not express."""
    spec = architecture.spec_of(profile, where)
    if spec is not None:
        architecture.unknown_fields(profile, HANDLED, MOE_HANDLED, "Megatron-LM", where)
    return spec


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
    """Megatron-LM's flags for a Hugging Face decoder family's model (not the GPT family: Megatron's default)."""
    if spec.family not in FAMILIES:
        raise InputError(f"{where}: field model.architecture.family: lynx knows no Megatron-LM flags that build a "
                         f"{spec.family!r} model; not exporting a different model")
    if (spec.norm, spec.mlp, spec.positions) != ("rmsnorm", "swiglu", "rotary"):
        raise InputError(f"{where}: field model.architecture: a {spec.family} model with {spec.norm}, {spec.mlp}, "
                         f"{spec.positions} positions: lynx exports only RMSNorm, SwiGLU, rotary decoders to Megatron")
    flags = [f"--num-layers {spec.num_layers}", f"--hidden-size {spec.hidden}",
             f"--num-attention-heads {spec.heads}", f"--ffn-hidden-size {spec.ffn_hidden}",
             "--normalization RMSNorm"]
    if spec.norm_eps is not None:
        flags.append(f"--norm-epsilon {_number(spec.norm_eps)}")
    flags += ["--swiglu", "--disable-bias-linear", "--position-embedding-type rope"]
    if spec.rope_theta is not None:
        flags.append(f"--rotary-base {_number(spec.rope_theta)}")
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
    if spec.qkv_bias:
        flags.append("--add-qkv-bias")
    if spec.qk_norm:
        flags.append("--qk-layernorm")
    if not spec.tie_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    flags += [f"--vocab-size {spec.vocab}", f"--make-vocab-size-divisible-by {vocab_divisor(spec.vocab, par.tp)}",
              "--attention-dropout 0.0", "--hidden-dropout 0.0"]  # the families train without dropout
    if spec.moe is not None:
        flags += moe_flags(spec, where)
    return flags


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
    if m.dense_layers:
        flags.append(f'--moe-layer-freq "([0]*{m.dense_layers}+[1]*{spec.num_layers - m.dense_layers})"')
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

