"""Mutation check: put one plausible one-line bug into the code at a time, run the tests that should notice it, put
the code back, and report which bugs the tests caught. Not run in CI (minutes): run it after changing a module or
its tests, and add a line to MUTANTS for each bug a test of yours is meant to catch.

    python scripts/mutants.py                 # every mutant
    python scripts/mutants.py tune export     # those whose file or name contains one of these words
    python scripts/mutants.py --list          # the table of mutants without running them
    python scripts/mutants.py --last 37       # the 37 added last (issue 31's)
    python scripts/mutants.py --last 45 --rows 24,28-35   # some rows of that table, numbered as it prints them

A mutant is (file, original text, replacement, test files). The original must occur exactly once in the file (so a
refactor that moves or rewrites the line shows up as `stale`, not as a silent pass). The file is restored after each
run, also on Ctrl-C, SIGTERM or an error (and a left-over backup from a killed run is put back at the next start).
By default it works on a scratch copy of the checkout (so you can keep editing while it runs); --in-place mutates
the checkout itself.
Outcomes: caught (a test failed), survived (all passed), stale (the original text is not in the file once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "lynx_planner/"


@dataclass(frozen=True)
class Mutant:
    file: str  # relative to lynx_planner/
    original: str
    replacement: str
    tests: tuple[str, ...]  # test files (relative to tests/), or pytest node ids
    what: str = ""  # the bug in words (defaults to the replacement)


def M(file: str, original: str, replacement: str, *tests: str, what: str = "") -> Mutant:
    return Mutant(file, original, replacement, tests, what)


B = "test_bite.py"  # this round's mutation-killing tests
BI = "test_bad_input_bounds.py"  # this round's bad-input guards
BM = "test_bite_more.py"  # the tests for the three mutants test_bite.py left alive
W = "test_cli_wiring.py"  # the command line's wiring and terminal leftovers
EB = "test_exports_and_bounds.py"  # issue 31: exports through the CLI, tune's bound per schedule
DE = "test_dp_experts.py"  # issue 31: experts' and tied embeddings' end of iteration
RR = "test_runtime_refusals.py"  # issue 31: the runtime's module-tree checks
BC = "test_bad_model_configs.py"  # issue 31: bad config.json / model JSON
CN = "test_cli_newcomer.py"  # issue 31: the command line a new user meets
TV = "test_tune_verdicts.py"  # issue 31: which GPUs, how many
MA = "test_modern_arithmetic.py"  # issue 31: the HF families' arithmetic, independently derived
FC = "test_fsdp_cp.py"  # FSDP / HSDP / CP: the whole file
# its derivations by hand (seconds, where the whole file takes minutes)
FH = tuple(f"test_fsdp_cp.py::test_{t}" for t in (
    "llama3_8b_fsdp8_static_bytes_by_hand", "hsdp_and_reshard_after_forward_bytes", "cp_attention_work_and_ring_exchange_by_hand",
    "fsdp_waits_by_hand_70b_hsdp_across_nodes", "fsdp_and_zero1_shard_over_dp_times_cp",
    "fsdp_of_an_fp32_model_gathers_fp32_parameters"))
OF = "test_offload.py"  # the copy engine and offload plans

# One line per mutant: M(file, original, replacement, test files..., what=...). Keep the original short but unique.
MUTANTS: list[Mutant] = [
    # tune.py
    M("tune.py", "for pp in divisors(gpus // (tp * cp), at_most=num_layers):",
      "for pp in divisors(gpus // (tp * cp), at_most=num_layers - 1):", B, "test_tune.py", what="pp > layers -> >="),
    M("tune.py", 'key=lambda r: (-r.tokens_per_s_per_gpu, r.layout, r.algo != "heu", r.algo))',
      'key=lambda r: (-r.tokens_per_s_per_gpu, r.layout, r.algo == "heu", r.algo))', B, "test_tune.py",
      what="ranking tie-break inverted"),
    M("tune.py", "if best_possible < min(heu_bar, meg_bar):", "if best_possible < max(heu_bar, meg_bar):", B,
      "test_tune.py", what="layouts pruned by the higher bar"),
    M("tune.py", "heu=best_possible >= heu_bar)", "heu=best_possible >= meg_bar)", B, "test_tune.py",
      what="HEU planned by Megatron's bar"),
    M("tune.py", "MICRO_BATCH_SIZES = (1, 2, 4, 8)", "MICRO_BATCH_SIZES = (1, 2, 4)", B, "test_tune.py",
      what="micro-batch sizes without 8"),
    M("tune.py", "return (m + bubble) * work / p + step", "return m * work / p + step", B, "test_tune.py",
      what="balanced ideal m*W/p"),
    M("tune.py", 'layers = [l.model_copy(update={"static_bytes": int(l.params * bpp)}) for l in base.layers]',
      "layers = list(base.layers)", B, "test_tune.py", what="optimizer bytes not re-sharded for model files"),
    # export.py
    M("exports/layout.py", 'return [f"--decoder-first-pipeline-num-layers {counts[0]}"]',
      'return [f"--decoder-first-pipeline-num-layers {counts[1]}"]', B, "test_export.py",
      what="pp=2 first-stage count"),
    M("export.py", 'f"--global-batch-size {par.micro_batch_size * par.num_microbatches * par.dp}"',
      'f"--global-batch-size {par.micro_batch_size * par.num_microbatches}"', B, "test_export.py",
      what="global batch without x dp"),
    M("parallel/__init__.py", "    elif par.distributed_optimizer:\n", "    elif not par.distributed_optimizer:\n", B, "test_export.py",
      what="torchtitan shard/replicate swapped"),
    M("export.py", "for k in range(1, per_stage):", "for k in range(2, per_stage):", B, "test_export.py",
      what="block 1 missing from Megatron's choices"),
    M("export.py", "    if par.sequence_parallel:\n", "    if not par.sequence_parallel:\n", B, "test_export.py",
      what="--sequence-parallel inverted"),
    # evaluate.py (check)
    M("evaluate.py", 'for field in ("dtype", "autocast"):', 'for field in ("dtype",):', B, "test_check.py",
      what="autocast not compared"),
    M("evaluate.py", "if pred.peak_memory_bytes > plan.memory_limit_bytes:",
      "if pred.activation_bytes > plan.memory_limit_bytes:", B, "test_check.py",
      what="limit against activations, not peak"),
    M("evaluate.py", 'if rec and p.at != "on_demand" and policy.cost(',
      'if rec and p.at == "grad_wait" and policy.cost(', B, "test_check.py",
      what="TP-collective early placement checked for one placement"),
    M("evaluate.py", "if sv.bound_s is not None and not sv.bound_s >= 0:", "if False:", B, "test_check.py",
      what="negative bound_s accepted"),
    M("evaluate.py", "        if keep:\n            out.append(f\"{where}: a uniform",
      "        if False:\n            out.append(f\"{where}: a uniform", B, "test_check.py",
      what="uniform-chunk keep check off"),
    M("evaluate.py", "TIME_ATOL_S = 1e-9", "TIME_ATOL_S = 1e-3", B, "test_check.py",
      what="time tolerance 1 ns -> 1 ms"),
    # calibrate.py
    M("calibrate.py", "factor = 2 * (world - 1) / world", "factor = (world - 1) / world", B,
      what="all-reduce bus factor (n-1)/n"),
    M("calibrate.py", '"memory_bytes_per_s": 2 * nbytes / copy_s', '"memory_bytes_per_s": nbytes / copy_s', B,
      what="copy bandwidth not doubled"),
    M("calibrate.py", "attn_flops = 4 * batch * heads * seq * seq * dim / 2",
      "attn_flops = 4 * batch * heads * seq * seq * dim", B, what="causal attention FLOPs not halved"),
    M("calibrate.py", "return _median_time(once, repeats, sync) / 2", "return _median_time(once, repeats, sync)", B,
      what="p2p latency not halved"),
    # validate.py
    M("validate.py", "backward_s=m * bwd + pred.exposed_recompute_s,", "backward_s=m * bwd,", B,
      what="predicted backward without exposed recompute"),
    M("validate.py", 'pr.iterations_s = [max(per_rank[r][i]["iterations"][k]',
      'pr.iterations_s = [min(per_rank[r][i]["iterations"][k]', B, what="iteration = min over ranks"),
    M("validate.py", "            held += kept[c]\n", "            held = kept[c]\n", B,
      what="kept bytes not x in-flight"),
    # simulator.py (DP)
    M("simulator.py", "ready -= sum(run.bwd)", "ready -= sum(run.bwd[0::2])", B, "test_dp.py",
      what="DP grads ready ignoring TP idle"),
    M("streams.py", '"dp": Group("dp", par.dp * par.cp, par.tp, DP)', '"dp": Group("dp", par.dp * par.cp, 1, DP)', B,
      "test_dp.py",
      what="DP bus over dp, not tp*dp"),
    # solvers
    M("solvers/heu.py", "POOL_PRICES = (0.0, 0.5)", "POOL_PRICES = (0.0,)", B, "test_solvers.py",
      what="pool prices (0.0,)"),
    M("solvers/heu.py", "contenders = screened[:3]", "contenders = screened[:1]", B, "test_solvers.py",
      what="one contender instead of three"),
    M("solvers/milp.py", "picks.sort(key=lambda x: -x[0].kept_bytes)", "picks.sort(key=lambda x: x[0].kept_bytes)",
      B, "test_solvers.py", what="MILP pick order reversed"),
    M("solvers/milp.py",
      '+ m.e_pool[s, "prev_forward"] + (1 - share(s, "prev_forward")) * pool_work(s, "prev_forward") / MS)',
      '+ m.e_pool[s, "prev_forward"])', B, "test_solvers.py", what="non-firing prev_forward not charged"),
    # runtime
    M("runtime/region.py", "        with self._rng.fork():\n            self._rng.restore()\n",
      "        with self._rng.fork():\n            pass\n", B, "test_runtime_apply.py",
      what="RNG restore before a re-run forward removed"),
    M("runtime/region.py", "program.shapes[p] != (t.shape, t.dtype)", "False", BM, B, "test_runtime_apply.py",
      what="saved-tensor shape divergence check removed"),
    M("runtime/keep.py", "if step.snap_time <= rec.steps[other].index < step.index",
      "if step.snap_time < rec.steps[other].index < step.index", B, "test_runtime_apply.py",
      what="RNG closure <= -> <"),
    # profiler
    M("profiler/structure.py", "key = (signature(slot.module), _input_key(slot), slot.ops)",
      "key = (signature(slot.module), slot.ops)", B, "test_profiler_model.py",
      what="block key ignoring input shapes"),
    M("profiler/structure.py", "return tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)",
      "return x", BM, B, "test_profiler_model.py", what="layer args not cloned"),
    M("profiler/recorder.py", "view = not inplace and all(k in in_keys for k in out_keys)",
      "view = not inplace and any(k in in_keys for k in out_keys)", BM, B, "test_profiler_model.py",
      what="view detection all -> any"),
    # this round's bad-input guards (tests/test_bad_input_bounds.py)
    M("tune.py", "    while d * d <= n:", "    while d * d < n:", BI, what="divisors miss the square root"),
    M("tune.py", "or global_batch // (mbs * dp) > MAX_MICROBATCHES:",
      "or global_batch // (mbs * dp) >= MAX_MICROBATCHES:",
      BI, what="layouts at exactly 4096 micro-batches skipped"),
    M("evaluate.py", "if not st.layers[0] <= p.layers[0] <= p.layers[1] <= st.layers[1]]",
      "if not st.layers[0] <= p.layers[0] <= p.layers[1]]", BI, what="policy end not bounded by the stage"),
    M("evaluate.py", "if plan.memory_limit_bytes > profile.hardware.memory_bytes:",
      "if plan.memory_limit_bytes >= profile.hardware.memory_bytes:", BI, what="limit = device memory refused"),
    M("export.py", 'half = profile.autocast or (profile.dtype if profile.dtype else "bf16")',
      'half = profile.dtype if profile.dtype else "bf16"', BI, what="autocast ignored by the precision flag"),
    M("commands/tune.py",
      '    for name in ("profile.json", "plan.json"):\n        check_output(out_dir / name, "--out")',
      '    for name in ("profile.json",):\n        check_output(out_dir / name, "--out")', BI,
      what="tune --out: plan.json not checked first"),
    M("commands/export.py", "    problems = verify(plan, prof).problems  # what", "    problems = []  # what", BI,
      what="export does not check the plan"),
    M("commands/user_code.py", "            real(code)\n        raise _HardExit(code)",
      "            real(code)\n        real(code)", BI,
      what="os._exit in a model file not intercepted"),
    M("plot.py", "write_atomic(path, buf.getvalue())", "path.unlink(missing_ok=True); path.write_bytes(buf.getvalue())",
      BI, what="plot replaces a symlink instead of its target"),
    # this round's model families, EP, schedules, candidates, accuracy, routing (authors' hand checks, re-run here)
    M("analytic/ops.py", 'ew(ops, f"{prefix}:pow#0", STAT * elems, saves=[x32])',
      'ew(ops, f"{prefix}:pow#0", STAT * elems)', "test_analytic_families.py",
      what="RMSNorm's pow not saving its fp32 input"),
    M("models/spec.py", "(a * d + 2 * kv * d if self.qkv_bias else 0)", "0", "test_models_spec.py", what="Qwen2 q/k/v bias dropped"),
    M("analytic/decoder.py", "routed // (t * par.ep)", "routed // t", "test_moe_ep.py", what="expert params not divided by ep"),
    M("analytic/mlp.py", "ep_all_to_all_s(ACT * nk * h, ep, par.tp,", "ep_all_to_all_s(ACT * nk * h, ep, 1,",
      "test_moe_ep.py",
      what="all-to-all link chosen from ep, not tp x ep"),
    M("schedules/interleaved.py", "+ 2 * (p - 1 - rank), m * v)", "+ (p - 1 - rank), m * v)", "test_schedules.py",
      what="interleaved warm-up 2(p-1-r) -> (p-1-r)"),
    M("schedules/zero_bubble.py", "        if j >= rank:", "        if j > rank:", "test_schedules.py",
      what="zero-bubble W after B: j >= rank -> j > rank"),
    M("simulator.py", "send = [0.0 if schedules.rank_of(p, c + 1) == schedules.rank_of(p, c) and c + 1 < n_chunks else",
      "send = [0.0 if False else", "test_schedules.py", what="sends between chunks of one rank not free"),
    M("evaluate.py", '"num_microbatches", "schedule", "virtual_stages", "ep",', '"num_microbatches", "schedule", "ep",',
      "test_schedules.py", what="check not comparing virtual_stages"),
    M("solvers/candidates.py", "if i >= 0 and ys[i] <= b + tol_b:", "if i >= 0 and ys[i] < b + tol_b:",
      "test_candidates_scale.py", what="candidate prune <= -> <"),
    M("solvers/repeats.py", "while start + (k + 1) * period <= n and", "while start + (k + 1) * period < n and",
      BM, "test_candidates_scale.py", what="repeat count misses a run ending at the last op"),
    M("solvers/heu.py", "x <= frontier[-1].exposed_s + 1e-15 and c.rec_s < frontier[-1].cand.rec_s",
      "False and c.rec_s < frontier[-1].cand.rec_s", "test_candidates_scale.py",
      what="HEU frontier tie rule (less recomputation) removed"),
    M("costs.py", "(_gemm_shape_s(m, n, k, hw, batch) + _gemm_shape_s(k, m, n, hw, batch))",
      "(2 * _gemm_shape_s(m, k, n, hw, batch))",
      "test_accuracy.py", what="gemm backward priced at the forward's shape"),
    M("runtime/routing.py", "out.update(make_id(f\"{prefix}{n}{dot}{sub}\", name, occurrence) for n in names)",
      "out.update(make_id(f\"{prefix}{n}{dot}{sub}\", name, occurrence) for n in [expert])",
      "test_runtime_composition.py", what="shared_keep: kept op not spread to the other experts"),
    # the command line's wiring and terminal leftovers (issues 18, 20)
    M("commands/helptext.py", "if _typer_options_panel is not None:", "if False:", W,
      what="cli leftover: --help cuts option names at 80 columns"),
    M("commands/helptext.py", "            if isinstance(part, Text):\n                part.overflow = \"fold\"",
      "            pass", W, what="cli leftover: --help cuts long words of option help"),
    M("commands/options.py", "    if limit > hw.memory_bytes:", "    if limit >= hw.memory_bytes:", W,
      what="cli leftover: the device's whole memory refused as a limit"),
    M("commands/plan.py", 'device_limit(size(memory_limit, "--memory-limit"), profile.hardware, f" in {profile_path}")',
      '(size(memory_limit, "--memory-limit") or device_limit(None, profile.hardware))', W,
      what="cli leftover: plan takes a limit above the device"),
    M("commands/tune.py", "            os.rmdir(tempfile.mkdtemp(",
      "            out_dir.mkdir(parents=True) or os.rmdir(tempfile.mkdtemp(", W,
      what="cli leftover: tune --out made before the search"),
    M("io.py", "        if _outputs:\n            _outputs[-1].staged",
      "        if False:\n            _outputs[-1].staged", W,
      what="cli leftover: outputs written before the report is out"),
    M("io.py", "                directory.rmdir()", "                pass", W,
      what="cli leftover: directories made for failed outputs kept"),
    M("commands/choices.py", "[(v, v) for v in values]", "[(v, v) for v in values[:3]]", W,
      what="cli leftover: an option's last choices dropped (zero-bubble)"),
    M("solvers/candidates.py", "            eps += f", "            eps = max(eps, f)", "test_candidates_scale.py",
      what="bounded search charges the largest step tolerance, not their sum"),
    M("solvers/candidates.py", "            eps += f", "            eps += f / 2", "test_candidates_scale.py",
      what="bounded search charges half a crowded step's tolerance"),
    M("solvers/candidates.py", "cap = LATE_CAP if _late() else step_cap", "cap = step_cap", "test_candidates_scale.py",
      what="a frontier built after the deadline keeps the full step cap"),
    M("solvers/candidates.py", "work > work_cap or (step_cap is not None and size > step_cap) or _late()",
      "work > work_cap or _late()", "test_candidates_scale.py", what="exact try ignores its step cap"),
    M("solvers/heu.py", "max_rounds: int = 32):", "max_rounds: int = 8):", "test_heu_repair.py", "test_candidates_scale.py",
      what="HEU repair gives up after 8 rounds (infeasible on an autocast MoE at the upper limit)"),
    # issue 31: the HF families' arithmetic against independent derivations (tests/test_modern_arithmetic.py)
    M("analytic/attention.py", "fwd = costs.attention_s(flops / 2, ops.hw, per_head_flops=flops / 2 / (b * heads))",
      "fwd = costs.attention_s(flops, ops.hw, per_head_flops=flops / (b * heads))", MA,
      what="HF attention priced non-causal"),
    M("analytic/mlp.py", "h, nk, f, ep = spec.hidden, n * m.top_k, m.expert_ffn // par.tp, par.ep",
      "h, nk, f, ep = spec.hidden, n * m.top_k, m.expert_ffn, par.ep", MA, what="expert GEMMs not split by TP"),
    M("analytic/mlp.py", 'shared = swiglu(ops, None, "mlp.shared_expert", n, h, m.shared_ffn // t, src, ln)',
      'shared = swiglu(ops, None, "mlp.shared_expert", n, h, m.shared_ffn, src, ln)', MA,
      what="Qwen2-MoE shared-expert GEMMs not split by TP"),
    M("analytic/mlp.py", 'swiglu(ops, None, "mlp.shared_experts", n, h, m.shared_ffn // t, src, ln)',
      'swiglu(ops, None, "mlp.shared_experts", n, h, m.shared_ffn, src, ln)', MA,
      what="DeepSeek shared-expert GEMMs not split by TP"),
    M("analytic/mlp.py", "ep_all_to_all_s(ACT * nk * h, ep, par.tp,", "ep_all_to_all_s(ACT * n * h, ep, par.tp,", MA,
      what="EP all-to-all moves tokens, not tokens x top-k"),
    M("analytic/decoder.py", "attn + (other - shared) + shared // t + norms", "attn + other + norms", MA,
      what="shared-expert params not split by TP"),
    M("analytic/decoder.py", "return attn + spec.dense_mlp_params() // t + norms, 0",
      "return attn + spec.dense_mlp_params() + norms, 0", MA, what="dense MLP params not split by TP"),
    M("analytic/decoder.py", "attn = split // t + replicated", "attn = (split + replicated) // t", MA,
      what="MLA's replicated down-projections split by TP"),
    M("analytic/decoder.py", "routed // (t * par.ep)", "routed // par.ep", MA, what="expert params not split by TP"),
    M("analytic/decoder.py", "    n_loc = n // par.tp if par.sequence_parallel else n\n    ops = _OpList(hw, context=cp)",
      "    n_loc = n\n    ops = _OpList(hw, context=cp)", MA, what="norms and residuals not split under SP"),
    M("analytic/decoder.py", "v * h // t if not spec.tie_embeddings or par.pp > 1 else 0",
      "v * h // t if not spec.tie_embeddings else 0", MA, what="tied head without weights on the last stage"),
    M("models/spec.py", "            + (h if m.shared_gate else 0)\n", "\n", MA, what="Qwen2-MoE shared-expert gate not counted"),
    M("models/spec.py", "moe_layers = sum(self.is_moe_layer(i) for i in range(self.num_layers))",
      "moe_layers = self.num_layers", MA,
      what="DeepSeek's dense layers counted as MoE in active params"),
    M("models/spec.py", 'head = 0 if self.tie_embeddings or self.family == "gpt" else v * h',
      'head = 0 if self.family == "gpt" else v * h', MA, what="tied embeddings counted twice"),
    # issue 31: exports through the CLI, tune's bound per schedule (tests/test_exports_and_bounds.py)
    M("tune.py", "bubble = 0.0 if schedules.get(par.schedule).splits_backward else (p - 1) / par.virtual_stages",
      "bubble = (p - 1) / par.virtual_stages", EB, B, what="tune's zero-bubble bound charges a bubble"),
    M("exports/megatron_model.py", 'return ([f"--expert-model-parallel-size {par.ep}"] if par.ep > 1 else []), []',
      'return [], []', EB,
      what="Megatron export drops --expert-model-parallel-size"),
    M("export.py", "flags += virtual_flags(profile, bounds) if par.virtual_stages > 1 else split_flags(profile, bounds)",
      "flags += split_flags(profile, bounds)", EB, what="Megatron export drops the virtual-stage flags"),
    M("export.py", "    if schedules.get(par.schedule).splits_backward:\n        notes.append(",
      "    if False:\n        notes.append(", EB, what="Megatron export drops the zero-bubble warning"),
    M("export.py", '"pipeline_parallel_schedule": schedules.get(par.schedule).torchtitan,',
      '"pipeline_parallel_schedule": "1F1B",', EB, what="torchtitan export always 1F1B"),
    # issue 31: the end of the iteration for experts and tied embeddings (tests/test_dp_experts.py)
    M("streams.py", "(per(g * e, en, eb) if e else 0.0)", "(per(g * e, n, b) if e else 0.0)", DE,
      what="expert gradients reduced over dp, not dp / ep"),
    M("simulator.py", "expert_shards = max(1, shards // par.ep)", "expert_shards = shards", DE,
      what="expert optimizer step sharded over dp, not dp / ep"),
    M("simulator.py", 'if profile.model.config.get("tie_embeddings") and profile.layers:', "if False:", DE,
      what="tied all-reduce only for a block named embedding"),
    # issue 31: the runtime's names and module tree (tests/test_runtime_refusals.py; test_names.py needs torchtitan)
    M("runtime/names.py", 'if path is None and mode != "none":', "if False:", RR,
      what="a recomputing layer without a counterpart silently skipped"),
    M("runtime/names.py", "if kept and len(kept) < 3:", "if False:",
      "test_names.py::test_torchtitan_refuses_ops_without_counterpart",
      what="fused-QKV partial keeps not refused"),
    M("runtime/names.py", 'table.update({roles[r][0]: _FUSED_QKV for r in ("q", "k", "v")})', "pass",
      "test_names.py::test_hf_plan_on_torchtitan_llama_equal_gradients", what="q/k/v not translated to the fused QKV GEMM"),
    M("runtime/routing.py", "any(p.dim() == 3 for p in m.parameters(recurse=False))",
      "any(p.dim() == 4 for p in m.parameters(recurse=False))", RR, what="fused (3-D weight) experts not detected"),
    M("runtime/routing.py", "if _identical([c for _, c in m.named_children()]) and any(True for _ in m.parameters()):",
      "if any(True for _ in m.parameters()):", RR, what="any ModuleList taken as identical experts"),
    M("runtime/conflicts.py", "any(isinstance(m, wrapper) for m in [*outer[1:], *inside])",
      "any(isinstance(m, wrapper) for m in inside)", RR, what="checkpoint_wrapper around a layer not detected"),
    # issue 31: config.json fields named, sizes bounded, MLP options refused (tests/test_bad_model_configs.py)
    M("models/families/llama.py", 'mlp_bias=f.get("mlp_bias", False, bool))', 'mlp_bias=f.get("mlp_bias", False, bool) and False)',
      "test_families.py::test_params_equal_transformers", what="mlp_bias read but not modelled"),
    M("models/families/qwen_moe.py", 'dense_ids=tuple(f.ints("mlp_only_layers")))',
      'dense_ids=tuple(f.ints("mlp_only_layers"))[:0])', "test_families.py::test_params_equal_transformers",
      what="mlp_only_layers read but not modelled"),
    M("models/families/__init__.py", "if kind is int and v == 0 and key not in _MAY_BE_ZERO:", "if False:", BC,
      what="a zero size named by lynx's field, not the config's"),
    M("models/families/__init__.py", "if kind is int and v > _MOST.get(key, MAX_WIDTH):", "if False:", BC,
      what="config sizes unbounded (10^9 layers)"),
    M("models/spec.py", "MAX_LAYERS = 1024", "MAX_LAYERS = 10**9",
      "test_bad_model_configs.py::test_model_spec_refuses_more_layers_than_it_can_build_at_once",
      what="model JSON layers unbounded"),  # the file's other tests would hang on 10^9 layers first
    # issue 31: what a new user meets on the command line (tests/test_cli_newcomer.py)
    M("tune.py", "        raise InputError(option_reason(gpus, hw, global_batch,",
      "        raise InputError((lambda *a: None)(gpus, hw, global_batch,", CN, what="tune --ep 3 blames --global-batch"),
    M("commands/options.py", 'if option == "--memory-limit" and value < MIN_MEMORY_LIMIT:', "if False:", CN,
      what="--memory-limit 16 taken as 16 bytes"),
    M("commands/terminal.py", "out.on_broken_pipe = silence_stdout", "pass", CN,
      what="| head -1: exit 1 and no file"),
    M("commands/terminal.py", "disable=disable or not err.is_terminal)", "disable=disable)", CN,
      what="piped stderr starts with an empty line"),
    # issue 31: which GPUs, how many (tests/test_tune_verdicts.py)
    M("tune.py", "cheapest = min(fit, key=lambda c: (c.gpu_hours, c.row.iteration_time_s, c.hardware))",
      "cheapest = min(fit, key=lambda c: (c.row.iteration_time_s / c.gpus, c.hardware))", TV,
      what="fewest GPU-hours taken as time per GPU"),
    M("tune.py", "fastest = min(fit, key=lambda c: (c.row.iteration_time_s, c.gpus, c.hardware))",
      "fastest = max(fit, key=lambda c: (c.row.tokens_per_s_per_gpu, c.gpus, c.hardware))", TV,
      what="fastest taken as the most tokens/s per GPU"),
    M("tune.py", "        return self.limit_bytes - self.row.peak_memory_bytes", "        return self.limit_bytes", TV,
      what="headroom without the peak"),
    M("tune.py", 'return sorted(out, key=lambda sv: sv[0] != "1f1b")[:1]', "return out", CN,
      what="tune --schedule all lists pp = 1 layouts once per schedule"),
    M("build.py", "near = difflib.get_close_matches(model, list(MODELS), n=3, cutoff=0.6)", "near = []", CN,
      what="model-name typo without a suggestion"),
    M("plot.py", "k = drawn.get(at, 0)", "k = 0", CN, what="a point hidden under another"),
    M("commands/helptext.py", "if all(isinstance(x, Text) for x in kind._cells):", "if False:", CN,
      what="--help: an 18-character description column at 80 columns"),
    M("validate.py", '        say(f"running {len(plans)} plan(s) in a {world}-stage gloo pipeline:',
      '        (lambda m: None)(f"running {len(plans)} plan(s) in a {world}-stage gloo pipeline:', CN,
      what="validate silent for tens of seconds"),
    # issue 31, second pass: rows for last round's code (streams, parallel/, offload, kernels/te, exports/layout,
    # families/). FC = the FSDP/CP hand derivations; several rows target lines other branches were changing
    M("parallel/fsdp.py", "return (PARAM_BYTES + GRAD_BYTES + ADAM_BYTES) / shard_ranks(par)",
      "return (PARAM_BYTES + GRAD_BYTES + ADAM_BYTES) / shard_size(par)", *FH, what="FSDP shards not over dp x cp"),
    M("parallel/fsdp.py", "during = [g * low + o + g * a + r * up for a, o, low, up in zip(n, own, below, above)]",
      "during = [g * low + o + r * up for a, o, low, up in zip(n, own, below, above)]", *FH, "test_runtime_fsdp.py",
      what="FSDP backward without the unsharded gradient"),
    M("parallel/fsdp.py", "post = [g * low + g * a + r * a + r * a // s for a, low in zip(n, below)]",
      "post = [g * low + g * a + r * a // s for a, low in zip(n, below)]", *FH,
      what="FSDP gradient without its fp32 reduce-scatter copy"),
    M("parallel/fsdp.py", "costs.all_reduce_s(REDUCE_BYTES * params / shard_ranks(par), replicas(par)",
      "costs.all_reduce_s(REDUCE_BYTES * params, replicas(par)", *FH, what="HSDP all-reduces the whole gradient"),
    M("parallel/fsdp.py", "    return par.dp // shard_size(par)", "    return 1", *FH, what="HSDP replicas taken as 1"),
    M("parallel/fsdp.py", '    return ("layer_above",)\n', '    return ("layer_above", "grad_wait")\n', FC,
      "test_offload.py", what="FSDP resharded: grad_wait allowed (its parameters are not gathered)"),
    M("parallel/fsdp.py", "return PARAM_BYTES if profile.dtype == \"fp32\" and profile.autocast is None else GATHER_BYTES",
      "return GATHER_BYTES", *FH, what="fp32 FSDP gathers 2-byte parameters"),
    M("parallel/cp.py", "BWD_BYTES_FACTOR = 2", "BWD_BYTES_FACTOR = 1", *FH, what="CP backward ring without dK/dV"),
    M("parallel/cp.py", "f = steps * max(0.0, costs.p2p_s(kv_bytes, bus) - fwd_s / cp)",
      "f = steps * max(0.0, costs.p2p_s(kv_bytes, bus) - fwd_s)", *FH,
      what="CP step hidden behind the whole attention, not 1/cp of it"),
    M("analytic/attention.py", "flops = 2.0 * b * s * s * ops.context * heads", "flops = 2.0 * b * s * s * heads", *FH,
      what="CP attention work not x cp (local keys only)"),
    M("parallel/zero1.py", "return par.dp * par.cp if par.distributed_optimizer else 1",
      "return par.dp if par.distributed_optimizer else 1", *FH, what="ZeRO-1 shards not over dp x cp"),
    M("streams.py", 'out["fsdp_shard"] = Group("fsdp_shard", shard * par.cp, par.tp, DP)',
      'out["fsdp_shard"] = Group("fsdp_shard", shard, par.tp, DP)', *FH, what="FSDP shard group without the CP ranks"),
    M("streams.py", "before = ag[j] if j == 0 else max(0.0, ag[j] - fwd_s[j - 1])",
      "before = ag[j] if j == 0 else max(0.0, ag[j] - fwd_s[j])", *FH,
      what="FSDP all-gather hidden behind the layer's own forward, not the one below"),
    M("streams.py", "max(0.0, comm - rec[j]), rec_beside=min(rec[j], comm)", "comm, rec_beside=0.0", *FH,
      what="FSDP backward waits not filled by on-demand recomputation"),
    M("streams.py", "kv = sum(ids[i].out_bytes for i in op.inputs[1:3] if i in ids)\n            f, b =",
      "kv = sum(ids[i].out_bytes for i in op.inputs[1:2] if i in ids)\n            f, b =", *FH,
      what="CP ring moves K only, not K and V"),
    # offload.py, solvers/offload.py
    M("offload.py", "return hw.inter_node_bus_bytes_per_s * min(1.0, nics / hw.gpus_per_node)",
      "return hw.inter_node_bus_bytes_per_s", OF, what="NIC share not divided among the GPUs sharing a NIC"),
    M("offload.py", "start = max(t, self.h2d_free, out_end)", "start = max(t, self.h2d_free)", OF,
      what="reload starts before the copy out ended"),
    M("offload.py", "dt = copies * self.link.latency_s + nbytes / self.link.d2h_bytes_per_s",
      "dt = copies * self.link.latency_s + nbytes / self.link.h2d_bytes_per_s",
      "test_offload.py::test_a_slow_link_stalls_the_backward_by_hand",
      what="copy out priced at the host-to-device rate"),
    M("offload.py", "bad = [o for o in pol.offload if o != BLOCK_INPUT and o not in kept]", "bad = []", OF,
      what="offloading a tensor that is not kept accepted"),
    M("solvers/offload.py", 'p.model_copy(update={"offload": [BLOCK_INPUT] + [u for u in p.keep if info.unit_bytes[u] > 0]})',
      'p.model_copy(update={"offload": [u for u in p.keep if info.unit_bytes[u] > 0]})', OF,
      what="full offload keeps the layer input on the device"),
    M("solvers/offload.py", "+ ([BLOCK_INPUT] if takes_input else [])", "", "test_offload.py::test_megatron_modules_on_llama",
      what="Megatron offload modules drop layer_input"),
    # kernels/te.py (Megatron-core with Transformer Engine)
    M("kernels/te.py", "fwd = costs.attention_s(flops / 2, hw, per_head_flops=flops / 2 / (b * heads))",
      "fwd = costs.attention_s(flops, hw, per_head_flops=flops / (b * heads))", "test_kernels.py",
      what="TE fused attention priced non-causal"),
    M("kernels/te.py", 'v = ew(ops, "self_attention:contiguous#0", ACT * n * kv * d, inputs=[qkv])',
      'v = ew(ops, "self_attention:contiguous#0", ACT * n * heads * d, inputs=[qkv])', "test_kernels.py",
      what="TE v sized by query heads, not kv heads"),
    M("kernels/te.py", "aux_bytes=STAT * b * heads * s, tags=", "aux_bytes=0, tags=", "test_kernels.py",
      what="TE attention without its softmax statistics"),
    M("kernels/te.py", 'fc2_in = _quantize(ops, "mlp.linear_fc2", act, n * f) if fp8 else act', "fc2_in = act",
      "test_kernels.py", what="fp8: linear_fc2 input kept in bf16"),
    M("kernels/te.py", "    n_loc = n // t if par.sequence_parallel else n\n", "    n_loc = n\n", "test_kernels.py",
      what="TE norms and residuals not split under SP"),
    # exports/layout.py (Megatron's stage split)
    M("exports/layout.py", "    if len(set(counts)) == 1:\n        return []", "    if False:\n        return []",
      "test_export.py::test_even_split_needs_no_flags", "test_export.py", "test_megatron_export.py",
      what="split flags for Megatron's own even split"),
    M("exports/layout.py", 'flags.append(f"--decoder-last-pipeline-num-layers {counts[-1]}")',
      'flags.append(f"--decoder-last-pipeline-num-layers {counts[0]}")',
      "test_export.py::test_uneven_ends_use_first_and_last_stage_flags", "test_export.py", "test_megatron_export.py",
      what="last-stage count taken from the first stage"),
    M("exports/layout.py", "    if loss is not None and any(stage_of[i] != stage_of[loss] for i in norms):",
      "    if False:", "test_megatron_export.py::test_a_final_norm_apart_from_the_loss_is_a_note",
      what="no note where Megatron moves the final norm to the loss's stage"),
    M("exports/layout.py", 'stages.append(",".join(tok if n == 1 else f"{tok}*{n}" for tok, n in runs))',
      'stages.append(",".join(tok for tok, n in runs))', "test_export.py", "test_megatron_export.py",
      what="layout string drops the run lengths"),
    M("exports/layout.py", "            if tok not in (EMBEDDING, DECODER, MTP, LOSS):",
      "            if tok not in (DECODER, MTP, LOSS):",
      "test_megatron_export.py::test_decoder_layers_are_t_whatever_their_mlp", "test_export.py",
      what="layout string without the embedding"),
    # models/families/ (transformers' parameter counts of tiny and published configs)
    M("models/families/llama.py", "qkv_bias=bias, o_bias=bias,", "qkv_bias=bias, o_bias=False,",
      "test_families.py::test_params_equal_transformers", what="Llama attention_bias without the o_proj bias"),
    M("models/families/qwen_moe.py", 'step=max(1, f.get("decoder_sparse_step", 1))',
      'step=min(1, f.get("decoder_sparse_step", 1))', "test_families.py::test_qwen_moe_interleaving_layers",
      "test_families.py::test_params_equal_transformers", what="decoder_sparse_step ignored"),
    M("models/families/deepseek_v2.py", "shared_experts=n_shared, shared_ffn=n_shared * expert_ffn,",
      "shared_experts=n_shared, shared_ffn=expert_ffn,", "test_published_families.py::test_params_equal_transformers",
      what="DeepSeek-V2 shared experts counted as one"),
    M("models/families/gpt_oss.py", "expert_ffn=kw[\"ffn_hidden\"], bias=True)", "expert_ffn=kw[\"ffn_hidden\"], bias=False)",
      "test_published_families.py::test_params_equal_transformers", what="gpt-oss experts without biases"),
    M("models/families/llama4.py", '    kw["ffn_hidden"] = f.get("intermediate_size_mlp")\n',
      '    f.get("intermediate_size_mlp")\n', "test_families.py::test_params_equal_transformers",
      "test_published_families.py::test_params_equal_transformers",
      what="Llama 4 dense layers sized as an expert"),
    M("models/families/gemma3.py", 'tuple("sliding" if (i + 1) % pattern else "full" for i in range(n))',
      'tuple("sliding" if i % pattern else "full" for i in range(n))', "test_families.py::test_gemma3_layer_pattern_is_transformers",
      "test_families.py", what="Gemma 3's full layer one early in sliding_window_pattern"),
    M("models/families/gemma3.py", 'mlp="geglu", norm_layout="sandwich",', 'mlp="geglu", norm_layout="pre",',
      "test_published_families.py::test_params_equal_transformers", what="Gemma 3 without its sandwich norms"),
    M("exports/layout.py", "or (LOSS if r[1] == last_final else NORM) for r in got]", "or NORM for r in got]",
      "test_megatron_export.py::test_decoder_layers_are_t_whatever_their_mlp", "test_export.py",
      what="the output layer taken as a final norm (no L in the layout)"),
    # add yours here: M("file.py", "original line", "bug", "test_x.py", what="...")
]


def scratch_copy() -> Path:
    """A copy of the checkout (without .git and caches) to mutate."""
    import tempfile

    dest = Path(tempfile.mkdtemp(prefix="lynx-mutants-")) / "repo"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache",
                                                              ".hypothesis", "*.mutant-backup"))
    return dest


def _backup(path: Path) -> Path:
    return path.with_name(path.name + ".mutant-backup")


def restore_leftovers(root: Path) -> None:
    """A run killed hard (SIGKILL) leaves its backup: put it back."""
    for backup in (root / PKG).rglob("*.mutant-backup"):
        shutil.move(backup, backup.with_name(backup.name.removesuffix(".mutant-backup")))
        print(f"restored {backup.name.removesuffix('.mutant-backup')} from a killed run", file=sys.stderr)


def run_one(mut: Mutant, timeout: float, root: Path = ROOT) -> tuple[str, float, str]:
    """(outcome, seconds, first failing test) of one mutant in the checkout at `root`; the file is always
    restored."""
    path = root / PKG / mut.file
    text = path.read_text()
    if text.count(mut.original) != 1:
        return "stale", 0.0, f"original found {text.count(mut.original)} times"
    backup = _backup(path)
    shutil.copy2(path, backup)
    t0 = time.perf_counter()
    try:
        path.write_text(text.replace(mut.original, mut.replacement))
        tests = [t if "/" in t else f"tests/{t}" for t in mut.tests]
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "caught", time.perf_counter() - t0, f"timeout after {timeout:g} s"
        failed = [ln.split(" ")[1] for ln in proc.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
        outcome = "survived" if proc.returncode == 0 else "caught"
        if proc.returncode not in (0, 1):
            failed = failed or [f"pytest exit {proc.returncode}"]
        return outcome, time.perf_counter() - t0, failed[0] if failed else ""
    finally:
        shutil.move(backup, path)  # also on KeyboardInterrupt


def _shown(tests: tuple[str, ...]) -> str:
    """The tests column: a file's node ids shortened to their count where there are more than two."""
    out: list[str] = []
    for t in tests:
        file = t.split("::")[0]
        ids = [x for x in tests if x.startswith(file + "::")]
        if len(ids) > 2:
            if f"{file} ({len(ids)} tests)" not in out:
                out.append(f"{file} ({len(ids)} tests)")
        else:
            out.append(t)
    return ", ".join(out)


def _rows(spec: str) -> set[int]:
    """'24,28-35' -> {24, 28, ..., 35}."""
    out: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    # explicit: a background job starts with SIGINT ignored, and kill sends SIGTERM; both must restore the file
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("select", nargs="*", help="run the mutants whose file or description contains one of these")
    ap.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    ap.add_argument("--last", type=int, default=0, help="only the last N mutants of the table (those added last)")
    ap.add_argument("--rows", default="", help="only these rows of the chosen table, e.g. 24,28-35 (numbers as printed)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per mutant's test run (then: caught)")
    ap.add_argument("--in-place", action="store_true", help="mutate this checkout instead of a scratch copy")
    args = ap.parse_args()
    restore_leftovers(ROOT)
    root = ROOT if args.in_place or args.list else scratch_copy()
    pool = MUTANTS[-args.last:] if args.last else MUTANTS
    chosen = [m for m in pool if not args.select or any(w in m.file or w in m.what for w in args.select)]
    rows = _rows(args.rows) if args.rows else set(range(1, len(chosen) + 1))
    print("| # | file | bug | tests | outcome | caught by | s |")
    print("|---|---|---|---|---|---|---|")
    counts: dict[str, int] = {}
    try:
        for i, mut in enumerate(chosen, 1):
            if i not in rows:
                continue
            what = (mut.what or mut.replacement).replace("|", "\\|")
            if args.list:
                print(f"| {i} | {mut.file} | {what} | {_shown(mut.tests)} | | | |", flush=True)
                continue
            outcome, secs, by = run_one(mut, args.timeout, root)
            counts[outcome] = counts.get(outcome, 0) + 1
            print(f"| {i} | {mut.file} | {what} | {_shown(mut.tests)} | {outcome} | {by} | {secs:.0f} |",
                  flush=True)
    except KeyboardInterrupt:
        print("interrupted: the mutated file is restored", file=sys.stderr)
        return 130
    finally:
        if root != ROOT:
            shutil.rmtree(root.parent, ignore_errors=True)
    if not args.list:
        print("\n" + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f" of {len(rows & set(range(1, len(chosen) + 1)))}")
    return 1 if counts.get("survived") or counts.get("stale") else 0


if __name__ == "__main__":
    sys.exit(main())
