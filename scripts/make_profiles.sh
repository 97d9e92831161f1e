#!/usr/bin/env bash
# Regenerate the shipped analytic profiles in profiles/ with `lynx profile`.
# Usage: scripts/make_profiles.sh [OUT_DIR]   (default: profiles/ beside this script's parent)
# Every profile: sequence length 2048, flash attention, dropout 0.1, 1F1B schedule.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-profiles}
mkdir -p "$out"

# model            hardware         tp pp mb  M
configs="
gpt-1.3b           a100-40g-nvlink  1  2  4   8
gpt-1.3b           a100-80g-nvlink  1  2  4   8
gpt-1.3b           a100-80g-pcie    2  2  2   8
gpt-2.7b           a100-40g-nvlink  2  2  2   8
gpt-2.7b           a100-80g-nvlink  1  4  2   8
gpt-2.7b           h100-80g-nvlink  2  4  4  16
gpt-6.7b           a100-40g-nvlink  4  4  1  16
gpt-6.7b           a100-80g-nvlink  2  4  2   8
gpt-6.7b           a100-80g-pcie    4  2  2   8
gpt-6.7b           h100-80g-nvlink  2  4  4  16
gpt-13b            a100-40g-nvlink  8  4  1  16
gpt-13b            a100-80g-nvlink  4  4  1  16
gpt-13b            a100-80g-nvlink  8  2  2   8
gpt-13b            a100-80g-pcie    4  4  1  16
gpt-13b            a100-80g-pcie    2  8  1  32
gpt-13b            h100-80g-nvlink  4  4  2  16
gpt-20b            a100-80g-nvlink  8  4  1  16
gpt-20b            a100-80g-nvlink  4  8  2  64
gpt-20b            a100-80g-pcie    4  8  1  32
gpt-20b            h100-80g-nvlink  8  4  2  32
gpt-22b            a100-80g-nvlink  8  4  1  16
gpt-22b            a100-80g-nvlink  4  8  2  32
gpt-22b            a100-80g-pcie    8  4  1  32
gpt-22b            h100-80g-nvlink  8  4  4  16
gpt-22b            h100-80g-nvlink  8  8  1  64
"

while read -r model hw tp pp mb m; do
  [ -z "$model" ] && continue
  name="$model-$hw-tp$tp-pp$pp-mb$mb-m$m"
  lynx profile "$model" --hardware "$hw" --tp "$tp" --pp "$pp" --micro-batch-size "$mb" --num-microbatches "$m" \
    --seq-len 2048 --attention flash --dropout 0.1 -o "$out/$name.json" >/dev/null
  echo "$out/$name.json"
done <<< "$configs"

# 2026 cases (issue 29): modern dense, MoE with EP, interleaved and zero bubble, on h100-80g-nvlink, bf16, seq 2048
# unless stated, no dropout. bench/models/deepseek-v3-14l.json is the catalog's deepseek-v3 cut to 14 layers.
h100=h100-80g-nvlink
lynx profile llama3-8b --hardware $h100 --tp 2 --pp 4 --micro-batch-size 1 --num-microbatches 16 \
  --schedule interleaved-1f1b --virtual-stages 2 -o "$out/llama3-8b-$h100-tp2-pp4-v2-mb1-m16.json" >/dev/null
lynx profile llama3-8b --hardware $h100 --tp 2 --pp 4 --micro-batch-size 1 --num-microbatches 16 \
  --schedule zero-bubble --virtual-stages 2 -o "$out/llama3-8b-$h100-tp2-pp4-zb-v2-mb1-m16.json" >/dev/null
lynx profile qwen3-32b --hardware $h100 --tp 4 --pp 4 --sequence-parallel --micro-batch-size 1 --seq-len 4096 \
  --num-microbatches 16 -o "$out/qwen3-32b-$h100-tp4-sp-pp4-mb1-s4096-m16.json" >/dev/null
lynx profile mixtral-8x7b --hardware $h100 --tp 2 --pp 4 --dp 8 --ep 8 --distributed-optimizer --micro-batch-size 1 \
  --num-microbatches 16 -o "$out/mixtral-8x7b-$h100-tp2-pp4-dp8-ep8-mb1-m16.json" >/dev/null
lynx profile bench/models/deepseek-v3-14l.json --hardware $h100 --tp 1 --pp 4 --dp 16 --ep 16 --distributed-optimizer \
  --micro-batch-size 1 --num-microbatches 16 --schedule interleaved-1f1b --virtual-stages 2 \
  -o "$out/deepseek-v3-14l-$h100-tp1-pp4-v2-dp16-ep16-mb1-m16.json" >/dev/null
ls "$out"/llama3-* "$out"/qwen3-* "$out"/mixtral-* "$out"/deepseek-*
