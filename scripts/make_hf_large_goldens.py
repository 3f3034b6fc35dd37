#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints with large activations, and their float64 goldens.

Issue 36: with `initializer_range` 0.2 (ten times the usual) and BF16 weights, attention scores
and activations are large, and any rounding on the CPU path to fewer than f32's bits shows in
the log-probabilities. This script writes, for llama and qwen2 (no QK-norm; qwen2 with Q/K/V
biases), hidden 64, 4 heads, 2 KV heads, head size 16, two layers:

  tests/golden/hf/<model>/model.safetensors  the BF16 weights (random, normal with std 0.2;
                                            norm weights 1 + N(0, 0.1))
  tests/golden/hf/<model>/config.json        a transformers config (`dtype: bfloat16`)
  tests/golden/hf/<model>/tokenizer*.json    llama-tiny's tokenizer (the test feeds ids)
  tests/golden/hf/<model>/f64.json           three prompts of random ids, the float64 reference's
                                            greedy continuation (16 steps, through EOS: never chosen) with its top-5
                                            log-probabilities and the gap between its top two

The reference is a float64 numpy forward written from the architectures' definitions (RMSNorm,
NeoX RoPE as transformers' rotate_half, GQA causal softmax attention, SiLU-gated MLP), on the
BF16-rounded weights widened exactly. No transformers or torch is needed (the folders also load
in transformers, as `AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)`).

Usage: python3 scripts/make_hf_large_goldens.py   (from the repository root; needs numpy)
"""
import json
import os
import shutil
import struct

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
HF = os.path.join(ROOT, "tests", "golden", "hf")
H, NH, NKV, HD, I, L, V = 64, 4, 2, 16, 128, 2, 320
STD = 0.2
STEPS = 16


def to_bf16(a):
    """Round f64 values to BF16 (round to nearest even), as uint16 words."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(w):
    return (w.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def weights(arch, seed):
    rng = np.random.default_rng(seed)
    t = {
        "model.embed_tokens.weight": rng.normal(0, STD, (V, H)),
        "lm_head.weight": rng.normal(0, STD, (V, H)),
        "model.norm.weight": 1 + rng.normal(0, 0.1, H),
    }
    for layer in range(L):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, H)
        t[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, H)
        for name, rows in [("q", NH * HD), ("k", NKV * HD), ("v", NKV * HD)]:
            t[p + f"self_attn.{name}_proj.weight"] = rng.normal(0, STD, (rows, H))
            if arch == "qwen2":
                t[p + f"self_attn.{name}_proj.bias"] = rng.normal(0, STD, rows)
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, STD, (H, NH * HD))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, STD, (I, H))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, STD, (I, H))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, STD, (H, I))
    return {k: to_bf16(v) for k, v in t.items()}


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, w in tensors.items():
        b = w.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(w.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def config(arch):
    base = json.load(open(os.path.join(HF, f"{arch}-tiny", "config.json")))
    base.update(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NKV, head_dim=HD, intermediate_size=I,
                num_hidden_layers=L, vocab_size=V, initializer_range=STD, dtype="bfloat16", tie_word_embeddings=False)
    if arch == "qwen2":
        base["layer_types"] = ["full_attention"] * L
    return base


def forward(w, cfg, ids):
    """Log-probabilities after every position, in float64."""
    eps, theta = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    inv = theta ** (-np.arange(0, HD, 2) / HD)
    ang = pos[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x):
        a, b = x[..., : HD // 2], x[..., HD // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    x = w["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(L):
        p = f"model.layers.{layer}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope(lin(h, p + "self_attn.q_proj").reshape(n, NH, HD))
        k = rope(lin(h, p + "self_attn.k_proj").reshape(n, NKV, HD))
        v = lin(h, p + "self_attn.v_proj").reshape(n, NKV, HD)
        o = np.zeros((n, NH, HD))
        for head in range(NH):
            kv = head // (NH // NKV)
            s = q[:, head] @ k[:, kv].T / np.sqrt(HD) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + lin(o.reshape(n, NH * HD), p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = lin(h, p + "mlp.gate_proj"), lin(h, p + "mlp.up_proj")
        x = x + lin(g / (1 + np.exp(-g)) * u, p + "mlp.down_proj")
    logits = rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
    m = logits.max(-1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))


def main():
    for arch, seed in [("llama", 36), ("qwen2", 37)]:
        name = f"{arch}-large-bf16"
        out = os.path.join(HF, name)
        os.makedirs(out, exist_ok=True)
        bf = weights(arch, seed)
        write_safetensors(os.path.join(out, "model.safetensors"), bf)
        cfg = config(arch)
        json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
        for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
            shutil.copy(os.path.join(HF, f"{arch}-tiny", f), out)
        w = {k: from_bf16(v) for k, v in bf.items()}
        rng = np.random.default_rng(seed + 100)
        cases = []
        for n_prompt in [5, 12, 24]:
            prompt = [int(i) for i in rng.integers(3, V, n_prompt)]
            ids, steps = list(prompt), []
            eos = cfg["eos_token_id"]
            for _ in range(STEPS):
                lp = forward(w, cfg, ids)[-1]
                top = np.argsort(-lp)[:5]
                # The test generates through EOS (`ignore_eos`: never chosen), so the choice is the
                # best other token; the top-5 are the raw distribution's.
                pick = [int(t) for t in np.argsort(-lp) if int(t) != eos][:2]
                steps.append({"top": [[int(t), float(lp[t])] for t in top], "gap": float(lp[pick[0]] - lp[pick[1]])})
                ids.append(pick[0])
            cases.append({"prompt_ids": prompt, "generated_ids": ids[n_prompt:], "steps": steps})
        json.dump({"model": name, "reference": "float64 numpy forward (scripts/make_hf_large_goldens.py)", "cases": cases},
                  open(os.path.join(out, "f64.json"), "w"), indent=1)
        print(name, "min top-2 gap", min(s["gap"] for c in cases for s in c["steps"]))


if __name__ == "__main__":
    main()
