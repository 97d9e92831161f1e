"""lynx's predicted peak memory of Megatron's DeepSeek-V3 benchmark proxy against the peaks Megatron measured.

Source: NVIDIA/Megatron-LM pull request #6311 (merged; the same arms in #6429), "Recompute EP A2A overlap activations
per layer": the DeepSeek-V3 benchmark recipe at 14 layers (256 experts, hidden 7168, MLA, MTP 1), seq 2048,
64 x H100, TP1 PP4 EP16 CP1, `--pipeline-model-parallel-layout "Ett|(tt|)*6mL"` (two virtual stages per rank),
MBS 1, GBS 256 (16 micro-batches per DP rank), bf16, alltoall dispatcher; peak = torch.cuda.max_memory_allocated:

    no overlap, no recompute                      68,704 MB
    no overlap, full recompute (uniform, 1)       60,154 MB

The recipe's optimizer sharding is not in the PR text: both are printed (with EP 16 on 64 ranks the experts have
one data-parallel rank, so the distributed optimizer shards only the dense weights' state). lynx prices Hugging
Face's eager modules here (`--kernels te` does not price MoE or MLA yet), which save more per layer than
Megatron's Transformer Engine modules.

    python benchmarks/deepseek_v3_proxy.py
"""

from __future__ import annotations

from lynx_planner import analytic, evaluate as ev
from lynx_planner.models.catalog import HF_CONFIGS
from lynx_planner.models.hardware import HARDWARE
from lynx_planner.models.hf_config import spec_from_hf
from lynx_planner.schema import ParallelConfig
from lynx_planner.solvers import megatron

PUBLISHED_MB = {"none": 68_704, "full": 60_154}
MB = 1 << 20


def profile(distributed_optimizer: bool):
    cfg = {**HF_CONFIGS["deepseek-v3"][1], "num_hidden_layers": 14, "num_nextn_predict_layers": 1}
    spec = spec_from_hf(cfg, "deepseek-v3-proxy", "Megatron-LM #6311 proxy")
    par = ParallelConfig(tp=1, pp=4, dp=16, ep=16, micro_batch_size=1, num_microbatches=16, seq_len=2048,
                         schedule="interleaved-1f1b", virtual_stages=2,
                         distributed_optimizer=distributed_optimizer)
    return analytic.profile(spec, par, HARDWARE["h100-80g-nvlink"])


def layout_bounds(prof) -> list[int]:
    """"Ett|(tt|)*6mL": the embedding and two layers, six chunks of two, the MTP module and the loss (lynx's
    layers: embedding, 14 decoder layers, the MTP module, final norm, head)."""
    assert len(prof.layers) == 18, [l.name for l in prof.layers]
    return [0, 3, 5, 7, 9, 11, 13, 15, 18]


def main() -> None:
    print(f"{'optimizer':12} {'recompute':10} {'lynx (MB)':>10} {'static':>8} {'activ.':>8} {'Megatron (MB)':>14} "
          f"{'ratio':>6}")
    for dist in (False, True):
        prof = profile(dist)
        bounds = layout_bounds(prof)
        n = len(prof.layers)
        layers = set(megatron.transformer_layers(prof))
        arms = {"none": [ev.none_policy(prof, i) for i in range(n)],
                "full": megatron._uniform(prof, bounds, 1)}
        for arm, pols in arms.items():
            assert arm == "none" or all(pols[i].recompute for i in layers)
            stages = ev.evaluate(prof, ev.stage_plans(prof, bounds, pols), ideal=False).predicted.stages
            top = max(stages, key=lambda st: st.peak_memory_bytes)  # the rank of the peak: its static and activations
            peak = top.peak_memory_bytes / MB
            print(f"{'distributed' if dist else 'replicated':12} {arm:10} {peak:10,.0f} {top.static_bytes / MB:8,.0f} "
                  f"{top.activation_bytes / MB:8,.0f} {PUBLISHED_MB[arm]:14,} {peak / PUBLISHED_MB[arm]:6.3f}")


if __name__ == "__main__":
    main()
