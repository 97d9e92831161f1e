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

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

Family = Literal["gpt", "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3",
                 "phi3", "olmo2", "gemma3_text", "glm4_moe", "deepseek_v2", "gpt_oss", "llama4_text", "qwen3_next"]
AttentionKind = Literal["full", "sliding", "chunked"]
MLA_FAMILIES = ("deepseek_v3", "deepseek_v2")
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss", "llama4_text",
                "qwen3_next")
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
    step: PositiveInt = Field(1, description="every step-th layer is MoE (layer i when (i + 1) % step == 0: Llama 4's "
                              "interleave_moe_layer_step, Qwen-MoE's decoder_sparse_step)")
    dense_ids: tuple[int, ...] = Field((), description="layers with a dense MLP whatever the pattern (mlp_only_layers)")
    bias: bool = Field(False, description="biases on the router and every expert projection (gpt-oss)")
    scoring: Literal["softmax", "sigmoid"] = Field("softmax", description="router scores: softmax top-k, or "
                                                   "DeepSeek's sigmoid with group-limited top-k")
    n_group: PositiveInt | None = Field(None, description="DeepSeek's router: expert groups (None: 8 where the "
                                        "experts are 64 or more and divide by 8, else 1)")
    topk_group: PositiveInt | None = Field(None, description="DeepSeek's router: groups a token's experts come from")
    norm_topk_prob: bool = Field(True, description="top-k routing weights renormalised to sum to 1")
    scaling: float = Field(1.0, gt=0, description="routing weights' scale (DeepSeek's routed_scaling_factor; priced "
                           "in the router's graph either way, recorded for exports)")

    @property
    def groups(self) -> int:
        """Expert groups of group-limited routing as the sigmoid router runs it (n_group, or its default)."""
        if self.scoring != "sigmoid":
            return 1
        return self.n_group or (8 if self.experts % 8 == 0 and self.experts >= 64 else 1)

    @property
    def group_topk(self) -> int:
        """Groups each token may route to (topk_group, or its default)."""
        if self.scoring != "sigmoid":
            return 1
        return self.topk_group or (4 if self.experts % 8 == 0 and self.experts >= 64 else 1)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds the number of experts ({self.experts})")
        if self.shared_experts and not self.shared_ffn:
            raise ValueError("shared_experts > 0 needs shared_ffn")
        return self


class LinearAttentionSpec(_Spec):
    """Gated DeltaNet (Qwen3-Next's linear_attention layers): q/k/v/z from one in-projection and beta/a from another,
    a short causal depthwise conv1d with SiLU over q, k and v, the gated delta rule over chunks of `chunk` tokens
    (a recurrent state of key_head_dim x value_head_dim per value head), a gated RMSNorm (z) and the out-projection.
    Each key head serves value_heads / key_heads value heads."""

    key_heads: Width
    value_heads: Width
    key_head_dim: Width
    value_head_dim: Width
    conv_kernel: Width = Field(4, description="taps of the causal conv1d over q, k and v")
    chunk: PositiveInt = Field(64, description="tokens per chunk of the chunked delta rule (transformers' and "
                               "flash-linear-attention's 64)")

    @property
    def conv_dim(self) -> int:
        """Channels of the conv1d: q, k and v together."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    def split_params(self, hidden: int) -> int:
        """Parameters split over TP ranks (by heads): in_proj_qkvz, in_proj_ba, the conv1d, dt_bias and A_log (one
        per value head), out_proj; the gated norm's weight (value_head_dim) is replicated."""
        kd, vd, nv = self.key_heads * self.key_head_dim, self.value_heads * self.value_head_dim, self.value_heads
        return hidden * (2 * kd + 2 * vd) + hidden * 2 * nv + self.conv_dim * self.conv_kernel + 2 * nv + vd * hidden

    @model_validator(mode="after")
    def _check(self) -> LinearAttentionSpec:
        if self.value_heads % self.key_heads:
            raise ValueError(f"linear key heads ({self.key_heads}) must divide linear value heads "
                             f"({self.value_heads})")
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
    mlp: Literal["gelu", "swiglu", "geglu"] = "swiglu"
    positions: Literal["learned", "rotary"] = "rotary"
    tie_embeddings: bool = False
    qkv_bias: bool = Field(False, description="biases on q/k/v projections (Qwen2)")
    qk_norm: bool = Field(False, description="RMSNorm on each query and key head (Qwen3)")
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    # features of the 2026 families (docs/models.md); the defaults are the Llama block
    layer_types: tuple[AttentionKind, ...] | None = Field(
        None, description="attention of each layer: full, sliding (window) or chunked (chunk); None: all full")
    window: PositiveInt | None = Field(None, description="sliding-window layers: keys a query attends to, itself "
                                       "included")
    chunk: PositiveInt | None = Field(None, description="chunked layers: a query attends within its chunk")
    attention_sinks: bool = Field(False, description="a learned logit per head in each softmax (gpt-oss)")
    o_bias: bool = Field(False, description="a bias on the attention output projection (attention_bias)")
    mlp_bias: bool = Field(False, description="biases on the dense MLP's projections (mlp_bias)")
    norm_layout: Literal["pre", "post", "sandwich"] = Field(
        "pre", description="pre: norm before attention/MLP; post: after them, before the residual add (OLMo 2); "
        "sandwich: both (Gemma 3)")
    qk_norm_scope: Literal["head", "all"] = Field("head", description="q/k norm over each head or all heads (OLMo 2)")
    rotary_fraction: float = Field(1.0, gt=0, le=1, description="share of each head's dims that rotary rotates")
    mtp_layers: int = Field(0, ge=0, description="multi-token-prediction modules (num_nextn_predict_layers): each an "
                            "input projection, one decoder layer, a norm, the shared head and a loss")
    qk_l2_norm: bool = Field(False, description="a weightless L2 norm on q and k after rotary (Llama 4)")
    nope_layers: tuple[int, ...] = Field((), description="layers without rotary (Llama 4's NoPE layers: full "
                                         "attention, temperature-scaled queries)")
    swiglu_limit: float | None = Field(None, gt=0, description="gpt-oss's clamp of the gated MLP's inputs (the gate "
                                       "at most, the linear half within +-limit); recorded for exports")
    linear_attention: LinearAttentionSpec | None = Field(None, description="the linear-attention layers' Gated "
                                                         "DeltaNet (Qwen3-Next)")
    linear_layers: tuple[int, ...] = Field((), description="layers whose token mixer is `linear_attention` instead "
                                           "of softmax attention")
    attn_output_gate: bool = Field(False, description="softmax attention's output times sigmoid of a gate that q_proj "
                                   "also projects (Qwen3-Next: q_proj is twice as wide)")
    notes: tuple[str, ...] = Field((), description="approximations made in reading the model (printed by profile)")
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
        if (self.family in MLA_FAMILIES) != (self.mla is not None):
            raise ValueError(f"mla is given exactly for the families {', '.join(MLA_FAMILIES)}")
        if (self.family in MOE_FAMILIES) != (self.moe is not None):
            raise ValueError(f"family {self.family!r}: moe must be given exactly for the MoE families")
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
            for kind, size, what in (("sliding", self.window, "window"), ("chunked", self.chunk, "chunk")):
                if kind in self.layer_types and size is None:
                    raise ValueError(f"layer_types has {kind!r} layers: {what} must be given")
        if (self.linear_attention is None) != (not self.linear_layers):
            raise ValueError("linear_layers and linear_attention are given together")
        if any(i >= self.num_layers for i in self.linear_layers):
            raise ValueError(f"linear_layers names a layer beyond num_layers ({self.num_layers})")
        return self

    def attention_kind(self, i: int) -> str:
        return "full" if self.layer_types is None else self.layer_types[i]

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def dim(self) -> int:
        """Head dimension of q, k and v (not MLA)."""
        return self.head_dim or self.hidden // self.heads

    def is_moe_layer(self, i: int) -> bool:
        m = self.moe
        return m is not None and i >= m.dense_layers and (i + 1) % m.step == 0 and i not in m.dense_ids

    def kv_pairs(self, i: int, seq_len: int) -> int:
        """(query, key) pairs layer i's causal attention computes per head and sequence: s(s+1)/2 for full
        attention, fewer in a sliding window (each query sees at most `window` keys) or within chunks."""
        return self.kv_pairs_of(self.attention_kind(i), seq_len)

    def kv_pairs_of(self, kind: str, seq_len: int) -> int:
        s = seq_len
        if kind == "sliding" and self.window < s:
            w = self.window
            return w * (w + 1) // 2 + (s - w) * w
        if kind == "chunked" and self.chunk < s:
            c, full = self.chunk, s // self.chunk
            r = s - full * c
            return full * c * (c + 1) // 2 + r * (r + 1) // 2
        return s * (s + 1) // 2

    # ---------------------------------------------------------------------------------------------- parameters

    def attention_split_params(self, i: int | None = None) -> tuple[int, int]:
        """(attention parameters split over TP ranks, parameters replicated on each) of layer i's token mixer (None:
        a softmax-attention layer)."""
        h, a, kv, d = self.hidden, self.heads, self.kv, self.dim
        if i is not None and i in self.linear_layers:
            return self.linear_attention.split_params(h), self.linear_attention.value_head_dim
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            replicated = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            split = m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim) + a * m.v_head_dim * h
            if m.q_lora_rank:
                replicated += h * m.q_lora_rank + m.q_lora_rank
                split += m.q_lora_rank * a * qk
            else:
                split += h * a * qk
            return split, replicated
        if self.family == "gpt":
            return 3 * h * h + 3 * h + h * h, h
        split = h * a * d + 2 * h * kv * d + a * d * h + (a * d + 2 * kv * d if self.qkv_bias else 0) \
            + (a if self.attention_sinks else 0)
        replicated = h if self.o_bias else 0
        if self.attn_output_gate:
            split += h * a * d
        if self.qk_norm:
            if self.qk_norm_scope == "all":
                split += a * d + kv * d
            else:
                replicated += 2 * d
        return split, replicated

    def attention_params(self, i: int = 0) -> int:
        split, replicated = self.attention_split_params(i)
        return split + replicated

    def dense_mlp_params(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        if self.mlp == "gelu":
            return 2 * h * f + f + h
        return 3 * h * f + (2 * f + h if self.mlp_bias else 0)

    def moe_params(self) -> tuple[int, int]:
        """(routed-expert parameters, other MoE-block parameters: router, shared experts, shared gate)."""
        m, h = self.moe, self.hidden
        assert m is not None
        routed = m.experts * (3 * h * m.expert_ffn + (2 * m.expert_ffn + h if m.bias else 0))
        other = m.experts * h + (m.experts if m.bias else 0) + (3 * h * m.shared_ffn if m.shared_ffn else 0) \
            + (h if m.shared_gate else 0)
        return routed, other

    def norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    def layer_norms(self) -> int:
        """Norms per layer: before attention and MLP, after them, or both (sandwich)."""
        return 4 if self.norm_layout == "sandwich" else 2

    def layer_params(self, i: int) -> int:
        mlp = sum(self.moe_params()) if self.is_moe_layer(i) else self.dense_mlp_params()
        return self.attention_params(i) + mlp + self.layer_norms() * self.norm_params()

    def mtp_params(self) -> int:
        """One multi-token-prediction module (DeepSeek-V3): embedding and hidden norms, the 2h -> h projection, a
        decoder layer as the last one, the head's norm (embedding and head are shared with the main model)."""
        h = self.hidden
        return 3 * self.norm_params() + 2 * h * h + self.layer_params(self.num_layers - 1)

    def params(self, seq_len: int = 2048) -> int:
        """Total parameters (learned positions: `seq_len` of them, as Megatron sizes its position table), the
        multi-token-prediction modules included (transformers does not build them)."""
        h, v = self.hidden, self.vocab
        embed = v * h + (seq_len * h if self.positions == "learned" else 0)
        head = 0 if self.tie_embeddings or self.family == "gpt" else v * h
        return sum(self.layer_params(i) for i in range(self.num_layers)) + embed + head + self.norm_params() \
            + self.mtp_layers * self.mtp_params()

    def active_params(self, seq_len: int = 2048) -> int:
        """Parameters one token passes through (MoE: top_k of the routed experts)."""
        if self.moe is None:
            return self.params(seq_len)
        routed, _ = self.moe_params()
        inactive = routed * (self.moe.experts - self.moe.top_k) // self.moe.experts
        moe_layers = sum(self.is_moe_layer(i) for i in range(self.num_layers)) \
            + (self.mtp_layers if self.is_moe_layer(self.num_layers - 1) else 0)
        return self.params(seq_len) - inactive * moe_layers
