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
