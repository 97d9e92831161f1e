"""ModelSpec: what the analytic profiler needs to know about a decoder-only transformer, as one pydantic model.

One description covers the GPT-3 family (LayerNorm, GeLU MLP, learned positions, multi-head attention) and the
families trained now: RMSNorm, SwiGLU, rotary positions, grouped-query attention (`kv_heads` < `heads`), DeepSeek's
multi-head latent attention (`mla`) and mixture-of-experts MLPs (`moe`). `family` picks the op graph (its op ids are
those lynx's profiler records for the matching Hugging Face model; 'gpt' is the Megatron-style GPT of gpt_block.py).

MoE token dispatch is assumed balanced: every expert receives tokens x top_k / experts tokens per micro-batch (the
load-balancing loss aims at this; a skewed router makes one EP rank slower and its memory larger than modelled).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

Family = Literal["gpt", "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"]
FAMILIES: tuple[str, ...] = Family.__args__  # type: ignore[attr-defined]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MLASpec(_Spec):
    """DeepSeek's multi-head latent attention: low-rank q (optional) and joint kv projections, split rope heads."""

    q_lora_rank: PositiveInt | None = Field(None, description="rank of the query down-projection (None: full q_proj)")
    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    qk_nope_head_dim: PositiveInt
    v_head_dim: PositiveInt


class MoESpec(_Spec):
    """Routed experts (SwiGLU each), a router, optional shared experts; the first `dense_layers` layers are dense."""

    experts: PositiveInt = Field(description="routed experts per MoE layer")
    top_k: PositiveInt = Field(description="experts each token is sent to")
    expert_ffn: PositiveInt = Field(description="FFN width of one routed expert")
    shared_experts: int = Field(0, ge=0, description="shared experts (every token); their FFN is `shared_ffn` wide")
    shared_ffn: int = Field(0, ge=0, description="FFN width of the shared expert MLP (all shared experts together)")
    shared_gate: bool = Field(False, description="a sigmoid gate on the shared expert's output (Qwen2-MoE)")
    dense_layers: int = Field(0, ge=0, description="the first k layers have a dense MLP of `ffn_hidden` (DeepSeek)")
    norm_topk_prob: bool = Field(True, description="top-k routing weights renormalised to sum to 1")
    # How the router scores (exports: the Megatron flags that build the same router). Defaults: Mixtral's softmax.
    score: Literal["softmax", "sigmoid"] = Field("softmax", description="router score function (DeepSeek: sigmoid, "
                                                 "with a load-balancing bias per expert)")
    groups: PositiveInt = Field(1, description="expert groups of group-limited routing (DeepSeek's n_group)")
    group_topk: PositiveInt = Field(1, description="groups each token may route to (DeepSeek's topk_group)")
    scaling: float = Field(1.0, gt=0, description="routing weights' scale (DeepSeek's routed_scaling_factor)")

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
    num_layers: PositiveInt
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (GQA); None: = heads")
    head_dim: PositiveInt | None = Field(None, description="None: hidden / heads")
    ffn_hidden: PositiveInt = Field(description="width of the dense MLP")
    vocab: PositiveInt
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    mlp: Literal["gelu", "swiglu"] = "swiglu"
    positions: Literal["learned", "rotary"] = "rotary"
    tie_embeddings: bool = False
    qkv_bias: bool = Field(False, description="biases on q/k/v projections (Qwen2)")
    qk_norm: bool = Field(False, description="RMSNorm on each query and key head (Qwen3)")
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    # Not sizes, but part of the model an export must build (None: the config does not say; transformers' default)
    rope_theta: float | None = Field(None, gt=0, description="rotary base (rotary positions)")
    norm_eps: float | None = Field(None, gt=0, description="epsilon of the norms")

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
