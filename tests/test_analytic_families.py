"""The analytic op graph of each Hugging Face decoder family against lynx's own profile of the HF model built from
the same (tiny) config in bf16: same layers and parameters, same op ids in the same order, same saved tensors and
bytes. DeepSeek-V3's and V2's attention core is the one exception: on the CPU sdpa decomposes MLA's attention (q/k
head dim differs from v's) into math ops, where the analytic graph has the fused kernel of the GPU; gpt-oss's too
(transformers runs its sink attention eagerly)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from lynx_planner.analytic import profile  # noqa: E402
from lynx_planner.models.hardware import HARDWARE  # noqa: E402
from lynx_planner.models.hf_config import spec_from_hf  # noqa: E402
from lynx_planner.profiler import profile_model_file  # noqa: E402
from lynx_planner.schema import Block, ParallelConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from hf_families import CONFIGS  # noqa: E402

HW = HARDWARE["h100-80g-nvlink"]
PAR = ParallelConfig(seq_len=16, micro_batch_size=2)
FUSED_CORE = "self_attn:_scaled_dot_product_flash_attention#0"
# blocks not compared op by op: Llama 4's MoE layers, which transformers runs densely (every expert on every token)
# where the analytic graph routes tokens as the training stacks do (parameters are still compared)
DENSE_ONLY = {"llama4_text": ("Llama4TextDecoderLayer_2", "Llama4TextDecoderLayer_3")}


def _profiles(family: str):
    real = profile_model_file(str(HERE / "hf_families.py"), parallel=PAR, hardware=HW, dtype="bf16", progress=False,
                              overrides={"family": family, "batch_size": 2, "seq_len": 16})
    return real, profile(spec_from_hf(CONFIGS[family], family, f"hf_families {family}"), PAR, HW)


def kept(block: Block, skip: set[str] = frozenset()) -> dict[str, int]:
    """Saved tensor -> bytes: outputs some op saves, and ops' own saved extras (aux)."""
    out = {op.id: op.out_bytes for op in block.ops}
    saved = {ref: out.get(ref, block.input_bytes) for op in block.ops if op.id not in skip for ref in op.saves
             if ref not in skip}
    saved |= {f"{op.id}[aux]": op.aux_bytes for op in block.ops if op.aux_bytes and op.id not in skip}
    return saved


@pytest.mark.parametrize("family", list(CONFIGS))
def test_analytic_matches_profiled_hf_model(family):
    real, ana = _profiles(family)
    real_layers = [(l.block, l.name, l.params) for l in real.layers if l.params or "rotary" not in l.name]
    assert [(l.block, l.name, l.params) for l in ana.layers] == real_layers
    for name, block in ana.blocks.items():
        if name in DENSE_ONLY.get(family, ()):
            continue
        if name == "Linear":  # the analytic head adds the loss's fp32 softmax, outside HF's lm_head module
            block = block.model_copy(update={"ops": block.ops[:-1]})
        theirs = real.blocks[name]
        skip: set[str] = set()
        if family.startswith(("deepseek_v3", "deepseek_v2", "gpt_oss")) and "DecoderLayer" in name:
            ours_ids = [op.id for op in block.ops]
            core = {op.id for op in theirs.ops} - set(ours_ids)
            skip = core | {FUSED_CORE, "self_attn.o_proj:mm#0", "self_attn.o_proj:addmm#0"}
            assert all(c.startswith("self_attn:") for c in core)
        ours = [op for op in block.ops if op.id not in skip]
        real_ops = [op for op in theirs.ops if op.id not in skip]
        assert [op.id for op in ours] == [op.id for op in real_ops]
        for a, r in zip(ours, real_ops):
            assert (a.out_bytes, a.aux_bytes, sorted(a.saves), sorted(a.inputs), a.inplace) == \
                (r.out_bytes, r.aux_bytes, sorted(r.saves), sorted(r.inputs), r.inplace), a.id
        k_ours, k_real = kept(block, skip), kept(theirs, skip)
        assert k_ours.keys() == k_real.keys()
        assert abs(sum(k_ours.values()) - sum(k_real.values())) <= 0.01 * sum(k_real.values())
