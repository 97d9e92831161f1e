#!/usr/bin/env bash
# Regenerate the example plans in plans/ from shipped profiles (byte-reproducible: --reproducible).
# Usage: scripts/make_plans.sh   (tests/test_shipped_plans.py checks every plan there against its profile)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p plans

# profile (in profiles/)                       limit        algorithms
configs="
gpt-13b-a100-80g-pcie-tp4-pp4-mb1-m16         16.1875GiB   heu opt full block adapipe
gpt-22b-h100-80g-nvlink-tp8-pp8-mb1-m64       8.8125GiB    heu full
gpt-1.3b-a100-80g-pcie-tp2-pp2-mb2-m8         7.0625GiB    heu full
"
echo "$configs" | while read -r name limit algos; do
  [ -n "$name" ] || continue
  for algo in $algos; do
    lynx plan "profiles/$name.json" --algo "$algo" --memory-limit "$limit" --reproducible \
      -o "plans/$name-$algo.json" > /dev/null
    echo "plans/$name-$algo.json"
  done
done
