#!/usr/bin/env bash
# On the device (after `scripts/h200.sh cmd true` made the models): one batched decode step of
# 1, 8 and 64 sequences at depth 1024 under each `batch_q8` shape given (`cera bench
# --concurrency --requests 0 --profile`), then the concurrency table beside llama.cpp with the
# shape whose summed tok/s is highest. Usage: bash scripts/batch-sweep.sh MODEL SHAPE...
set -uo pipefail
m=$1; shift
best=""; best_sum=0
for t in "$@"; do
  out=$(timeout 60 /tmp/b/cera bench -m "$m" --concurrency 1,8,64 --requests 0 --profile -d 1024 --kv-budget 8G --tune "batch_q8=$t" 2>&1)
  rows=$(echo "$out" | grep -E "^\| (1|8|64) \| 1024 \|")
  sum=$(echo "$rows" | awk -F'|' '{s += $7} END {printf "%d", s}')
  echo "== batch_q8=$t: summed tok/s $sum"; echo "$rows"; echo "$out" | grep -E "quant_gemv" | head -3
  if [ "${sum:-0}" -gt "$best_sum" ]; then best_sum=$sum; best=$t; fi
done
echo "best: batch_q8=$best ($best_sum)"
timeout 300 /tmp/b/cera bench -m "$m" --concurrency 1,8,32,64 --kv-budget 24G --tune "batch_q8=$best" ${LLAMA:+--vs-llama-cpp /tmp/llama} 2>&1 | grep -v "^bench:"
