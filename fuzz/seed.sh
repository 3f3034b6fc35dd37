#!/bin/sh
# Writes the seed corpus (a small valid GGUF and safetensors file) into fuzz/corpus/.
set -e
cd "$(dirname "$0")"
mkdir -p corpus/gguf corpus/safetensors
cargo run -q --manifest-path ../cera/Cargo.toml --example write_fuzz_seeds -- corpus
