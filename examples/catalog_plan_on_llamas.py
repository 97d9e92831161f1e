"""A catalog plan on the models people train: the analytic `llama3-8b` profile (no model is run), its HEU plan, and
that plan applied, stage by stage, to Hugging Face's LlamaForCausalLM and to torchtitan 0.3's Llama 3 of the same
depth (32 layers; narrow, to fit a CPU), in bf16, with the gradients of the unplanned model compared bit for bit.

    python examples/catalog_plan_on_llamas.py [--limit 60GiB] [--out DIR]

The plan names HF's layers and ops (model.layers.N, self_attn.q_proj:mm#0, ...): on torchtitan they are mapped by
role (runtime/names.py; docs/integrations.md). torchtitan is optional (pip install 'lynx-planner[torchtitan]'): without
it that column says so. The loss runs outside the layers in both stacks, as the plan assumes (docs/integrations.md).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from lynx_planner.io import load_model
from lynx_planner.runtime import apply_plan, runtime_of
from lynx_planner.schema import Plan

LAYERS, SEQ, BATCH = 32, 16, 2  # llama3-8b's depth


def lynx(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "lynx_planner.cli", *map(str, args)], check=True, stdout=subprocess.DEVNULL)


def hf_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=SEQ, use_cache=False,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(torch.bfloat16)


def torchtitan_llama() -> torch.nn.Module | None:
    if importlib.util.find_spec("torchtitan") is None:
        return None
    from lynx_planner.integrations.torchtitan import debug_llama3

    torch.manual_seed(0)
    return debug_llama3(layers=LAYERS, fuse_qkv=False, dtype=torch.bfloat16)


def grads(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    out = model(tokens)
    (out.logits if hasattr(out, "logits") else out).float().square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def check(model: torch.nn.Module | None, vocab: int, plan: Plan, stage: int) -> str:
    """'equal (R recomputed)' when the planned model's gradients equal the unplanned one's, bit for bit."""
    if model is None:
        return "torchtitan not installed"
    tokens = torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(stage))
    reference = grads(model, tokens)
    planned = apply_plan(copy.deepcopy(model), plan, stage=stage)
    got = grads(planned, tokens)
    same = got.keys() == reference.keys() and all(torch.equal(g, reference[n]) for n, g in got.items())
    recomputed = len(runtime_of(planned).recomputations(0))
    return f"{'equal' if same else 'DIFFERENT'} ({recomputed} layers recomputed)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", default="60GiB", help="memory limit of the HEU plan")
    ap.add_argument("--out", type=Path, help="keep the profile and plan here (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        lynx("profile", "llama3-8b", "--pp", 4, "--hardware", "h100-80g-nvlink", "--seq-len", 8192,
             "--micro-batch-size", 1, "--num-microbatches", 16, "-o", out / "profile.json")
        lynx("plan", out / "profile.json", "--algo", "heu", "--memory-limit", args.limit, "-o", out / "plan.json")
        plan = load_model(out / "plan.json", Plan)
        hf, tt = hf_llama(), torchtitan_llama()
        print(f"lynx profile llama3-8b --pp 4 (analytic, HF names); lynx plan --algo heu --memory-limit {args.limit}")
        print(f"applied to HF LlamaForCausalLM and torchtitan Llama 3 ({LAYERS} layers each, bf16, narrow), "
              "gradients vs the unplanned model:")
        print(f"{'stage':>5}  {'plan layers':<30} {'recompute':>9}  {'HF Llama':<30} {'torchtitan Llama 3':<30}")
        for st in plan.stages:
            names = f"{st.layer_names[0]}..{st.layer_names[-1].removeprefix('model.')}"
            recompute = sum(p.layers[1] - p.layers[0] for p in st.policies if p.mode != "none")
            print(f"{st.stage:>5}  {names:<30} {recompute:>9}  {check(hf, 128, plan, st.stage):<30} "
                  f"{check(tt, 2048, plan, st.stage):<30}")


if __name__ == "__main__":
    main()
