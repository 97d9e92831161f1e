"""Print what Megatron-LM builds from `lynx export --to megatron` of a Llama, a Mixtral and a DeepSeek-V3 plan: the
flags go through megatron-core 0.19.2's own parser, validate_args and TransformerConfig build (its pipeline-layout
check included; tests/megatron_parser.py), and each parsed field is printed beside the profiled model's.
tests/test_megatron_export.py asserts the same against the configs' own fields.

Run: PYTHONPATH=.:tests python scripts/megatron_export_check.py   (needs megatron-core 0.19.2, installed with
pip install --no-deps --ignore-requires-python megatron-core==0.19.2)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import megatron_parser  # noqa: E402
from lynx_planner import analytic, export, solvers  # noqa: E402
from lynx_planner.models.catalog import HF_CONFIGS  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.models.hf_config import spec_from_hf  # noqa: E402
from lynx_planner.schema import ParallelConfig  # noqa: E402

CASES = {  # name: (config.json, parallel layout)
    "Llama 3 8B": (HF_CONFIGS["llama3-8b"][1], dict(tp=2, pp=4, num_microbatches=8, seq_len=4096)),
    "Mixtral 8x7B": (HF_CONFIGS["mixtral-8x7b"][1], dict(tp=2, pp=2, dp=4, ep=4, sequence_parallel=True,
                                                          num_microbatches=4, seq_len=4096)),
    "DeepSeek-V3 (with its MTP module)": (json.loads((ROOT / "tests/data/hf/deepseek-v3.json").read_text()),
                                          dict(tp=8, pp=16, dp=8, ep=8, sequence_parallel=True,
                                               num_microbatches=8, seq_len=4096)),
}


def rows(spec, args, config) -> list[tuple[str, object, object]]:
    """(field, the profiled model's, Megatron's parsed)."""
    act = "swiglu" if config.gated_linear_unit and config.activation_func.__name__ == "silu" else \
        f"{'gated ' if config.gated_linear_unit else ''}{config.activation_func.__name__}"
    m = spec.moe
    out = [("layers", spec.num_layers, config.num_layers), ("hidden", spec.hidden, config.hidden_size),
           ("heads", spec.heads, config.num_attention_heads)]
    if spec.mla is None:
        out += [("query groups", spec.kv, config.num_query_groups), ("head dim", spec.dim, config.kv_channels)]
    else:
        a = spec.mla
        out.append(("MLA (q, kv rank, qk, rope, v dims)",
                    (a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim),
                    (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim, config.qk_pos_emb_head_dim,
                     config.v_head_dim)))
    out += [("FFN (dense)", spec.ffn_hidden, config.ffn_hidden_size),
            ("norm", spec.norm, config.normalization.lower()), ("activation", spec.mlp, act),
            ("positions", f"{spec.positions} base {spec.rope_theta:g}",
             f"{'rotary' if args.position_embedding_type == 'rope' else args.position_embedding_type} base "
             f"{args.rotary_base:g}"),
            ("tied embeddings", spec.tie_embeddings, not args.untie_embeddings_and_output_weights)]
    if m is not None:
        bits = [int(spec.is_moe_layer(i)) for i in range(spec.num_layers)]
        freq = config.moe_layer_freq
        out += [("experts", m.experts, config.num_moe_experts), ("top-k", m.top_k, config.moe_router_topk),
                ("expert FFN", m.expert_ffn, config.moe_ffn_hidden_size),
                ("shared expert FFN", m.shared_ffn or None, config.moe_shared_expert_intermediate_size),
                ("MoE layers", sum(bits), sum(freq) if isinstance(freq, list) else spec.num_layers),
                ("router scores", m.scoring, config.moe_router_score_function)]
    out.append(("MTP modules", spec.mtp_layers, config.mtp_num_layers or 0))
    return out


def main() -> None:
    hw = HARDWARE["h100-80g-nvlink"]
    for name, (cfg, par) in CASES.items():
        spec = spec_from_hf(cfg, name, name)
        prof = analytic.profile(spec, ParallelConfig(**par), hw)
        plan = solvers.plan(prof, "p.json", "0" * 64, "none", 1 << 50)
        got = export.megatron(plan, prof)
        p = prof.parallel
        args, config = megatron_parser.parse(got.flags, p.tp * p.pp * p.dp)
        print(f"{name}: tp {p.tp} pp {p.pp} dp {p.dp} ep {p.ep}: Megatron's parser, validate_args and "
              f"TransformerConfig build (layout check) passed")
        for field, ours, theirs in rows(spec, args, config):
            print(f"  {field:36} {str(ours):30} {str(theirs):30} {'ok' if ours == theirs else 'DIFFERS'}")


if __name__ == "__main__":
    main()
