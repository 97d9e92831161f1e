"""ModelSpec: what the analytic profiler needs to know about a decoder-only transformer, as one pydantic model.

One description covers the GPT-3 family (LayerNorm, GeLU MLP, learned positions, multi-head attention) and the
families trained now: RMSNorm, SwiGLU, rotary positions, grouped-query attention (`kv_heads` < `heads`), DeepSeek's
multi-head latent attention (`mla`) and mixture-of-experts MLPs (`moe`). `family` picks the op graph (its op ids are
those lynx's profiler records for the matching Hugging Face model; 'gpt' is the Megatron-style GPT of gpt_block.py).

MoE token dispatch is assumed balanced: every expert receives tokens x top_k / experts tokens per micro-batch (the
load-balancing loss aims at this; a skewed router makes one EP rank slower and its memory larger than modelled).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Family = Literal["gpt", "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"]
FAMILIES: tuple[str, ...] = Family.__args__  # type: ignore[attr-defined]


# Bounds on a model's sizes, far above any real model's (the deepest have ~128 layers, the widest FFN ~10^5, the
# largest vocabularies ~2.6 * 10^5, the most experts 384): a typo (10^9 layers, a 10^30 FFN) is refused at once
# instead of building a profile for minutes or writing a 10^26-parameter model.
MAX_LAYERS = 1024
MAX_WIDTH = 1 << 20  # hidden, FFN, head and low-rank dimensions, heads
MAX_VOCAB = 1 << 24
MAX_EXPERTS = 1 << 16
Layers = Annotated[int, Field(gt=0, le=MAX_LAYERS)]
Width = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
Vocab = Annotated[int, Field(gt=0, le=MAX_VOCAB)]
Experts = Annotated[int, Field(gt=0, le=MAX_EXPERTS)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MLASpec(_Spec):
    """DeepSeek's multi-head latent attention: low-rank q (optional) and joint kv projections, split rope heads."""

    q_lora_rank: Width | None = Field(None, description="rank of the query down-projection (None: full q_proj)")
    kv_lora_rank: Width
    qk_rope_head_dim: Width
    qk_nope_head_dim: Width
    v_head_dim: Width


class MoESpec(_Spec):
    """Routed experts (SwiGLU each), a router, optional shared experts; the first `dense_layers` layers are dense."""

    experts: Experts = Field(description="routed experts per MoE layer")
    top_k: Experts = Field(description="experts each token is sent to")
    expert_ffn: Width = Field(description="FFN width of one routed expert")
    shared_experts: int = Field(0, ge=0, le=MAX_EXPERTS, description="shared experts (every token); their FFN is `shared_ffn` wide")
    shared_ffn: int = Field(0, ge=0, le=MAX_WIDTH, description="FFN width of the shared expert MLP (all shared experts together)")
    shared_gate: bool = Field(False, description="a sigmoid gate on the shared expert's output (Qwen2-MoE)")
    dense_layers: int = Field(0, ge=0, le=MAX_LAYERS, description="the first k layers have a dense MLP of `ffn_hidden` (DeepSeek)")
    norm_topk_prob: bool = Field(True, description="top-k routing weights renormalised to sum to 1")

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds the number of experts ({self.experts})")
        if self.shared_experts and not self.shared_ffn:
            raise ValueError("shared_experts > 0 needs shared_ffn")
        return self


class ModelSpec(_Spec):
    """A decoder-only transformer. Sizes are of the whole model (tensor parallelism splits them in the profile)."""

    schema_version: Literal[1] = 1
    name: str
    source: str = Field("", description="where the numbers come from (a Hugging Face config, a paper)")
    family: Family = Field(description="op graph to build: 'gpt' (Megatron GPT) or a Hugging Face model_type")
    num_layers: Layers
    hidden: Width
    heads: Width
    kv_heads: Width | None = Field(None, description="key/value heads (GQA); None: = heads")
    head_dim: Width | None = Field(None, description="None: hidden / heads")
    ffn_hidden: Width = Field(description="width of the dense MLP")
    vocab: Vocab
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    mlp: Literal["gelu", "swiglu"] = "swiglu"
    positions: Literal["learned", "rotary"] = "rotary"
    tie_embeddings: bool = False
    qkv_bias: bool = Field(False, description="biases on q/k/v projections (Qwen2)")
    qk_norm: bool = Field(False, description="RMSNorm on each query and key head (Qwen3)")
    mla: MLASpec | None = None
    moe: MoESpec | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.heads % self.kv:
            raise ValueError(f"kv_heads ({self.kv}) must divide heads ({self.heads})")
        if self.head_dim is None and self.hidden % self.heads and self.mla is None:
            raise ValueError(f"heads ({self.heads}) must divide hidden ({self.hidden}) unless head_dim is given")
        if self.family == "gpt" and (self.norm, self.mlp, self.positions, self.moe, self.mla) != \
                ("layernorm", "gelu", "learned", None, None):
            raise ValueError("family 'gpt' is the Megatron GPT: layernorm, gelu, learned positions, no MoE or MLA")
        if self.moe is not None and self.moe.dense_layers > self.num_layers:
            raise ValueError(f"moe.dense_layers ({self.moe.dense_layers}) exceeds num_layers ({self.num_layers})")
        if (self.family == "deepseek_v3") != (self.mla is not None):
            raise ValueError("mla is given exactly for family 'deepseek_v3'")
        if (self.family in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")) != (self.moe is not None):
            raise ValueError(f"family {self.family!r}: moe must be given exactly for the MoE families")
        return self

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dim(self) -> int:
        """Head dimension of q, k and v (not MLA)."""
        return self.head_dim or self.hidden // self.heads

    def is_moe_layer(self, i: int) -> bool:
        return self.moe is not None and i >= self.moe.dense_layers

    # ---------------------------------------------------------------------------------------------- parameters

    def attention_params(self) -> int:
        h, a, kv, d = self.hidden, self.heads, self.kv, self.dim
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = h * a * qk if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk
            kv_ = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank \
                + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv_ + a * m.v_head_dim * h
        if self.family == "gpt":
            return 3 * h * h + 3 * h + h * h + h
        p = h * a * d + 2 * h * kv * d + a * d * h
        if self.qkv_bias:
            p += a * d + 2 * kv * d
        if self.qk_norm:
            p += 2 * d
        return p

    def dense_mlp_params(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        return 2 * h * f + f + h if self.mlp == "gelu" else 3 * h * f

    def moe_params(self) -> tuple[int, int]:
        """(routed-expert parameters, other MoE-block parameters: router, shared experts, shared gate)."""
        m, h = self.moe, self.hidden
        assert m is not None
        routed = m.experts * 3 * h * m.expert_ffn
        other = m.experts * h + (3 * h * m.shared_ffn if m.shared_ffn else 0) + (h if m.shared_gate else 0)
        return routed, other

    def norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def layer_params(self, i: int) -> int:
        mlp = sum(self.moe_params()) if self.is_moe_layer(i) else self.dense_mlp_params()
        return self.attention_params() + mlp + 2 * self.norm_params()

    def params(self, seq_len: int = 2048) -> int:
        """Total parameters (learned positions: `seq_len` of them, as Megatron sizes its position table)."""
        h, v = self.hidden, self.vocab
        embed = v * h + (seq_len * h if self.positions == "learned" else 0)
        head = 0 if self.tie_embeddings or self.family == "gpt" else v * h
        return sum(self.layer_params(i) for i in range(self.num_layers)) + embed + head + self.norm_params()

    def active_params(self, seq_len: int = 2048) -> int:
        """Parameters one token passes through (MoE: top_k of the routed experts)."""
        if self.moe is None:
            return self.params(seq_len)
        routed, _ = self.moe_params()
        inactive = routed * (self.moe.experts - self.moe.top_k) // self.moe.experts
        return self.params(seq_len) - inactive * (self.num_layers - self.moe.dense_layers)
