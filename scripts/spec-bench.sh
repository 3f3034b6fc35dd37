#!/usr/bin/env bash
# On the device (after `scripts/h200.sh stage` put SmolLM2 in /tmp/models, and `scripts/h200.sh
# cmd true` made the synthetic models): `cera run` with and without n-gram speculative decoding
# (greedy, -n 256, three runs each, the median decode tok/s), on copy-heavy prompts with the real
# SmolLM2 (drafts right) and a repetitive prompt with the synthetic llama-1b and llama-8b (drafts
# almost never right: the cost of verifying at acceptance near 0).
# Usage: bash scripts/spec-bench.sh [DRAFT_MAX...]   (default 4 8)
set -uo pipefail
B=/tmp/b/cera
SMOL=/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
drafts=("${@:-4 8}")
[ $# -eq 0 ] && drafts=(4 8)
list="Repeat the following list exactly, one item per line, and nothing else:
$(for i in $(seq 1 40); do echo "- item $i: the quick brown fox number $i jumps over the lazy dog"; done)"
code="Rewrite this Python code exactly as it is, adding nothing:
$(for i in $(seq 1 12); do printf 'def add_%d(a, b):\n    \"\"\"Return a plus b plus %d.\"\"\"\n    total = a + b + %d\n    return total\n\n' $i $i $i; done)"
rep=$(for i in $(seq 1 60); do printf 'one two three four five six seven eight nine ten. '; done)
# median decode tok/s, then drafts and accepted of the last run
measure() {
  local model=$1 prompt=$2; shift 2
  local r rates=() last=""
  for r in 1 2 3; do
    last=$($B run -m "$model" --temp 0 -n 256 --ignore-eos --json "$@" "$prompt" 2>/dev/null)
    rates+=("$(echo "$last" | grep -o '"decode_tok_s":[0-9.]*' | cut -d: -f2)")
  done
  local med
  med=$(printf '%s\n' "${rates[@]}" | sort -g | sed -n 2p)
  local d a s ids
  ids=$(echo "$last" | grep -o '"generated_ids":\[[0-9,]*\]' | md5sum | cut -c1-8)
  d=$(echo "$last" | grep -o '"draft_tokens":[0-9]*' | cut -d: -f2)
  a=$(echo "$last" | grep -o '"accepted_tokens":[0-9]*' | cut -d: -f2)
  s=$(echo "$last" | grep -o '"decode_steps":[0-9]*' | cut -d: -f2)
  echo "$med ${a:-0}/${d:-0} ${s:-0} $ids"
}
echo "| model | prompt | draft-max | decode tok/s | accepted/drafted | steps for 255 tokens | speed-up | same ids as off |"
echo "|---|---|---|---|---|---|---|---|"
row() {
  local name=$1 model=$2 pname=$3 prompt=$4 extra=${5:-}
  local base
  base=$(measure "$model" "$prompt" $extra)
  echo "| $name | $pname | off | ${base%% *} | - | $(echo "$base" | cut -d' ' -f3) | 1.00x | - |"
  for k in "${drafts[@]}"; do
    local s
    s=$(measure "$model" "$prompt" $extra --spec-type ngram --draft-max "$k")
    local same=no
    [ "$(echo "$s" | cut -d' ' -f4)" = "$(echo "$base" | cut -d' ' -f4)" ] && same=yes
    echo "| $name | $pname | $k | ${s%% *} | $(echo "$s" | cut -d' ' -f2) | $(echo "$s" | cut -d' ' -f3) | $(awk -v a="${s%% *}" -v b="${base%% *}" 'BEGIN {printf "%.2fx", a / b}') | $same |"
  done
}
[ -f $SMOL ] && row SmolLM2-135M $SMOL "copy a list" "$list"
[ -f $SMOL ] && row SmolLM2-135M $SMOL "copy code" "$code"
for m in llama-1b llama-8b; do
  f=/tmp/m/$m-q4_0.gguf
  [ -f "$f" ] && row "$m (synthetic)" "$f" "repetitive, drafts wrong" "$rep" --raw
done
