#!/usr/bin/env bash
# The local side of `scripts/h200.sh`: builds and packs, here, what the H200 machine runs. The
# device tool carries at most 64 MiB a call (the tracked tree, ~12 MiB, included), so everything
# lands in target-dev/ (ignored by git) in pieces that fit one call each.
#
# Usage (from the repository root):
#   bash scripts/h200-pack.sh tests         every test binary of the workspace (release, stripped)
#                                           and the `cera` binary the CLI tests spawn, in one
#                                           solid archive: target-dev/tests/tests.tar.xz, or in
#                                           pieces of 50 MiB (target-dev/tests/NN/) when larger
#   bash scripts/h200-pack.sh model NAME... a cached test model (`smollm2-135m`, `gemma3-270m`;
#                                           `cera fetch NAME` puts it in the cache) cut into pieces
#                                           of at most 50 MiB: target-dev/NAME/FILE.NN-of-MM
#   bash scripts/h200-pack.sh bins          stripped release `cera` and `xtask`: target-dev/bin/
#
# Then, on the device (each call carries `.gl` and one piece folder; calls must follow each other
# within the machine's warm time, ~30 s, or the pieces already sent are gone):
#   carry [.gl, target-dev/tests]        command: bash scripts/h200.sh stage
#   carry [.gl, target-dev/smollm2-135m] command: bash scripts/h200.sh stage   (one call a piece:
#                                        pack-model writes each piece in its own subfolder)
#   carry [.gl]                          command: bash scripts/h200.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
D=target-dev
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
PIECE=$((50 * 1024 * 1024))

pack_tests() {
    local json out=$D/tests
    json=$(mktemp)
    cargo test --release --workspace --no-run --message-format=json >"$json"
    cargo build --release -p cera --bin cera --message-format=json >>"$json"
    rm -rf "$out" "$D/tests-stage"
    mkdir -p "$out" "$D/tests-stage/bin"
    # The manifest: the workspace root the binaries were built in (their CARGO_MANIFEST_DIR and
    # golden paths point there), then one line per test binary (package folder, file), then the
    # `cera` binary's absolute path (CARGO_BIN_EXE_cera of the CLI tests).
    python3 - "$json" "$PWD" "$D/tests-stage" <<'EOF'
import json, os, shutil, subprocess, sys
src, root, stage = sys.argv[1], sys.argv[2], sys.argv[3]
# Test binaries that read their own debug info, kept unstripped: decode_allocations attributes
# each allocation by its backtrace's functions and files (inlined frames included).
KEEP_DEBUG = {"decode_allocations"}
lines, seen, cera = [f"root {root}"], set(), None
for line in open(src):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    exe, kind = m["executable"], m["target"]["kind"]
    if m["profile"]["test"]:
        if exe in seen:
            continue
        seen.add(exe)
        pkg = os.path.relpath(os.path.dirname(m["manifest_path"]), root)
        name = os.path.basename(exe)
        if name.rsplit("-", 1)[0] in KEEP_DEBUG:
            shutil.copy(exe, os.path.join(stage, "bin", name))
        else:
            subprocess.run(["strip", "-o", os.path.join(stage, "bin", name), exe], check=True)
        lines.append(f"test {pkg} {name}")
    elif kind == ["bin"] and m["target"]["name"] == "cera":
        cera = exe
if cera is None:
    sys.exit("no cera binary was built")
subprocess.run(["strip", "-o", os.path.join(stage, "bin", "cera"), cera], check=True)
lines.append(f"cera {cera}")
open(os.path.join(stage, "manifest"), "w").write("\n".join(lines) + "\n")
print(f"{len(seen)} test binaries")
EOF
    rm -f "$json"
    # One solid archive with a dictionary as large as the binaries: they share most of their code
    # (wgpu, naga, numr, boostr), which a large window stores once.
    tar -C "$D/tests-stage" -cf - . | xz -9e --lzma2=dict=512MiB -T1 >"$out/tests.tar.xz"
    rm -rf "$D/tests-stage"
    ls -l "$out/tests.tar.xz"
    split_tests
}

# An archive over one call's room goes in pieces, as a model does: target-dev/tests/NN/ (carry
# one folder a call; `h200.sh stage` puts them together).
split_tests() {
    local out=$D/tests f=$D/tests/tests.tar.xz size n i
    size=$(stat -c %s "$f")
    [ "$size" -gt "$PIECE" ] || return 0
    n=$(((size + PIECE - 1) / PIECE))
    for ((i = 0; i < n; i++)); do
        local part
        part=$(printf '%s/%02d/tests.tar.xz.%02d-of-%02d' "$out" "$i" "$i" "$n")
        mkdir -p "$(dirname "$part")"
        dd if="$f" of="$part" bs=$PIECE skip="$i" count=1 status=none
    done
    sha256sum "$f" | cut -d' ' -f1 >"$out/00/tests.tar.xz.sha256"
    rm -f "$f"
    echo "tests: $n pieces in $out/NN/ (carry one folder a call: target-dev/tests/00, ...)"
}

pack_model() {
    local name=$1 file path
    case $name in
        smollm2-135m) file=SmolLM2-135M-Instruct.Q4_1.gguf ;;
        gemma3-270m) file=gemma-3-270m-Q4_K_M.gguf ;;
        *) echo "h200-pack: unknown model $name (smollm2-135m, gemma3-270m)" >&2; exit 2 ;;
    esac
    path=${CERA_MODEL_CACHE:-$HOME/.cache/cera/models}/$file
    [ -f "$path" ] || { echo "h200-pack: $path is missing: run \`cera fetch $name\` first" >&2; exit 1; }
    rm -rf "${D:?}/$name"
    local size n i
    size=$(stat -c %s "$path")
    n=$(((size + PIECE - 1) / PIECE))
    for ((i = 0; i < n; i++)); do
        local part
        part=$(printf '%s/%s/%02d/%s.%02d-of-%02d' "$D" "$name" "$i" "$file" "$i" "$n")
        mkdir -p "$(dirname "$part")"
        dd if="$path" of="$part" bs=$PIECE skip="$i" count=1 status=none
    done
    sha256sum "$path" | cut -d' ' -f1 >"$D/$name/00/$file.sha256"
    echo "$name: $n pieces in $D/$name/NN/ (carry one folder a call: target-dev/$name/00, ...)"
}

pack_bins() {
    cargo build --release -p cera -p xtask
    mkdir -p "$D/bin"
    strip -o "$D/bin/cera" "$TARGET/release/cera"
    strip -o "$D/bin/xtask" "$TARGET/release/xtask"
    ls -l "$D/bin"
}

mode=${1:-}
shift || true
case $mode in
    tests) pack_tests ;;
    split-tests) split_tests ;;
    model) for m in "$@"; do pack_model "$m"; done ;;
    bins) pack_bins ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
esac
