#!/usr/bin/env python3
"""An independent float64 reference of Gemma 3 270M Q4_K_M, on a prompt past its sliding window.

Weights come from gguf-py (`pip install gguf numpy`), dequantized by gguf-py itself; the Gemma 3
forward pass is written here in numpy float64 from the architecture, sharing no code with the
project:
- the embedding row times sqrt(hidden);
- RMSNorm before and after both the attention and the FFN (pre/post norms), per-head RMSNorm of
  q and k (QK-norm), and a final norm. Gemma's norm multiplies by `1 + w`; llama.cpp's converter
  stores `1 + w` in the GGUF (its norm tensors are mostly well above 0 here, e.g. `attn_norm`
  between 0.7 and 100), so the stored value is the multiplier. Multiplying by `1 + stored` instead
  puts llama.cpp's goldens several nats away (`--check-llama-cpp` shows which one agrees);
- NeoX RoPE (rotating the two halves of each head) with the file's `rope.freq_base` on global
  layers and Gemma 3's local base 10000 on sliding-window layers;
- every `pattern`-th layer global (Gemma 3: 6; layers 5, 11, 17), the others attending only to the
  last `sliding_window` positions (a key `j` is seen from query `i` when `i - j < window`);
- attention scaled by `query_pre_attn_scalar ** -0.5` (Gemma 3 270M: 256, its head size), one KV
  head shared by all query heads (GQA);
- a GELU(tanh)-gated FFN, and the LM head tied to the embedding (unless `output.weight` exists),
  with final logit soft-capping if the metadata names one (Gemma 3 has none).
Hyperparameters are read from the GGUF metadata; a key the file lacks takes Gemma 3's published
default (printed).

The prompt is natural text (PROMPT below) tokenized by **cera's** tokenizer (`cera tokenize
--ids-only`), so the golden does not depend on a Python tokenizer, and cut to `--tokens` ids (640:
past the 512-token window). It records the top-5 log-probabilities (natural-log softmax over the
whole vocabulary) after prompt positions `--positions` (around the window's edge: at 511 the
window still holds position 0, at 512 it no longer does) and after `--steps` greedy decode steps
past the prompt: the float64 greedy ids are fed back one at a time at positions 640, 641, ...

`--check-llama-cpp` instead runs the reference teacher-forced over llama.cpp's greedy
continuations in tests/golden/generation/gemma3-270m.json and prints how far it lies from
llama.cpp's top-5 log-probabilities (llama.cpp's CPU run rounds activations to 8 bits, so it is
loose: see that folder's README) and whether the argmax agrees where llama.cpp's margin is clear.

Usage: python3 scripts/make_gemma_f64_goldens.py [--model PATH] [--cera CMD] [--check-llama-cpp]
Writes tests/golden/generation/gemma3-270m-f64.json.
"""
import argparse, hashlib, json, os, pathlib, shlex, subprocess
import numpy as np
import gguf

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/golden/generation/gemma3-270m-f64.json"

PROMPT = """\
For most of human history, people told the time by the sun. A stick pushed upright into the ground casts a shadow that swings from west to east as the day goes on, and by the time of the early Egyptian and Babylonian civilisations such shadow clocks had become carefully marked instruments of stone. Their great weakness was obvious: they were useless at night and on cloudy days, and the length of an hour changed with the seasons, because the daylight was divided into twelve equal parts whether the day was long or short.

Water clocks answered part of the problem. In the simplest kind, water dripped at a steady rate from a small hole in the bottom of a vessel, and the falling level, read against marks on the inside wall, showed how much time had passed. Greek engineers in Alexandria added floats, gears and pointers, and later builders in China and the Islamic world made towers in which falling water turned wheels that struck bells, opened little doors and moved figures of people and animals. Such machines were marvels, but they needed constant attention, and the water froze in winter and evaporated in summer.

The mechanical clock appeared in European monasteries and cathedral towers near the end of the thirteenth century. Its heart was the escapement, a device that let a falling weight turn the gears only in small, regular steps instead of all at once. Early tower clocks often had no dial at all; they simply rang a bell to call the monks to prayer, and the English word clock comes from a medieval word for bell. These machines could drift by a quarter of an hour in a single day, so they were set again each noon by the sun.

A great improvement came in 1656, when the Dutch scientist Christiaan Huygens built the first clock regulated by a pendulum. Galileo had noticed decades earlier that a swinging weight keeps nearly the same period whatever the size of its swing, and Huygens turned that observation into a practical mechanism. His clocks kept time to within a minute or less each day, and within a few years pendulum clocks were being made across Europe, with minute hands added to their faces for the first time.

At sea, however, a pendulum was of little use, since the rolling of a ship disturbed its swing. This mattered enormously, because a navigator who knew the exact time at his home port could compare it with local noon and work out how far east or west he had travelled. Governments offered large prizes for a solution, and the English carpenter John Harrison spent most of his life building a series of marine timekeepers. His fourth, a large watch finished in 1759, lost only a few seconds on a voyage to Jamaica, and its successors, the chronometers, were carried on ships around the world for the next two centuries.

In the twentieth century quartz crystals, which vibrate at a precise frequency when an electric current passes through them, made accurate clocks cheap enough for every wrist, and atomic clocks, which count the oscillations of caesium atoms, became so stable that since 1967 the second itself has been defined by them rather than by the turning of the Earth. The best of them would neither gain nor lose a second in many millions of years, and the satellites that guide ships, aircraft and telephones today each carry several of them."""


class Gemma3:
    """Gemma 3 in float64 over gguf-py's dequantization, with a KV cache for decoding."""

    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.fields = r.fields
        arch = self.meta("general.architecture")
        assert arch == "gemma3", arch
        m = lambda k, default=None: self.meta(f"{arch}.{k}", default)
        self.D = m("embedding_length")
        self.L = m("block_count")
        self.NH = m("attention.head_count")
        self.NKV = m("attention.head_count_kv")
        self.HD = m("attention.key_length", self.D // self.NH)
        self.eps = m("attention.layer_norm_rms_epsilon", 1e-6)
        self.rope_dim = m("rope.dimension_count", self.HD)
        self.base_global = m("rope.freq_base", 1e6)
        self.base_local = m("rope.local_freq_base", 1e4)
        self.window = m("attention.sliding_window", 512)
        self.pattern = m("attention.sliding_window_pattern", 6)
        self.scale = m("attention.query_pre_attn_scalar", self.HD) ** -0.5
        self.final_softcap = m("final_logit_softcapping", 0.0) or None
        self.attn_softcap = m("attn_logit_softcapping", 0.0) or None
        T = {t.name: t for t in r.tensors}
        W = lambda name: np.asarray(gguf.quants.dequantize(T[name].data, T[name].tensor_type), dtype=np.float64)
        names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output", "post_attention_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]
        self.layers = [{k: W(f"blk.{l}.{k}.weight") for k in names} for l in range(self.L)]
        self.embd = W("token_embd.weight")
        self.head = W("output.weight") if "output.weight" in T else self.embd
        self.out_norm = W("output_norm.weight")
        self.reset()

    def meta(self, key, default=None):
        f = self.fields.get(key)
        if f is None:
            if default is not None:
                print(f"metadata {key} absent: Gemma 3's default {default}")
            return default
        return f.contents()

    def describe(self):
        return {"dim": self.D, "layers": self.L, "heads": self.NH, "kv_heads": self.NKV, "head_dim": self.HD, "rms_eps": self.eps,
                "rope_base_global": self.base_global, "rope_base_local": self.base_local, "sliding_window": self.window,
                "global_every": self.pattern, "attn_scale": self.scale, "final_softcap": self.final_softcap}

    def reset(self):
        self.K = [np.zeros((0, self.NKV, self.HD)) for _ in range(self.L)]
        self.V = [np.zeros((0, self.NKV, self.HD)) for _ in range(self.L)]

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base):
        # x: (T, heads, HD); NeoX: element i pairs with i + rope_dim / 2.
        half = self.rope_dim // 2
        th = pos[:, None] * base ** (-np.arange(half) * 2.0 / self.rope_dim)
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        a, b = x[..., :half].copy(), x[..., half:self.rope_dim].copy()
        y = x.copy()
        y[..., :half] = a * c - b * s
        y[..., half:self.rope_dim] = a * s + b * c
        return y

    def forward(self, ids):
        """Runs `ids` at the positions after the cache; returns the final-normed hidden states."""
        p0 = self.K[0].shape[0]
        n = len(ids)
        pos = np.arange(p0, p0 + n, dtype=np.float64)
        x = self.embd[ids] * np.sqrt(self.D)
        qi, kj = np.arange(p0, p0 + n)[:, None], np.arange(p0 + n)[None, :]
        for l, w in enumerate(self.layers):
            is_global = (l + 1) % self.pattern == 0
            base = self.base_global if is_global else self.base_local
            visible = kj <= qi
            if not is_global:
                visible &= qi - kj < self.window
            h = self.rms(x, w["attn_norm"])
            q = (h @ w["attn_q"].T).reshape(n, self.NH, self.HD)
            k = (h @ w["attn_k"].T).reshape(n, self.NKV, self.HD)
            v = (h @ w["attn_v"].T).reshape(n, self.NKV, self.HD)
            q = self.rope(self.rms(q, w["attn_q_norm"]), pos, base)
            k = self.rope(self.rms(k, w["attn_k_norm"]), pos, base)
            self.K[l] = np.concatenate([self.K[l], k])
            self.V[l] = np.concatenate([self.V[l], v])
            o = np.zeros((n, self.NH, self.HD))
            for hh in range(self.NH):
                kv = hh // (self.NH // self.NKV)
                s = q[:, hh] @ self.K[l][:, kv].T * self.scale
                if self.attn_softcap:
                    s = self.attn_softcap * np.tanh(s / self.attn_softcap)
                s = np.where(visible, s, -np.inf)
                e = np.exp(s - s.max(axis=1, keepdims=True))
                o[:, hh] = (e / e.sum(axis=1, keepdims=True)) @ self.V[l][:, kv]
            x = x + self.rms(o.reshape(n, -1) @ w["attn_output"].T, w["post_attention_norm"])
            h = self.rms(x, w["ffn_norm"])
            g, u = h @ w["ffn_gate"].T, h @ w["ffn_up"].T
            gelu = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
            x = x + self.rms((gelu * u) @ w["ffn_down"].T, w["post_ffw_norm"])
        return self.rms(x, self.out_norm)

    def logprobs(self, hidden):
        """The natural-log softmax over the vocabulary of one final hidden state."""
        lg = self.head @ hidden
        if self.final_softcap:
            lg = self.final_softcap * np.tanh(lg / self.final_softcap)
        m = lg.max()
        return lg - m - np.log(np.exp(lg - m).sum())


def top(lp, k=5):
    ids = [int(i) for i in np.argsort(-lp, kind="stable")[:k]]
    return {"ids": ids, "logprobs": [round(float(lp[i]), 7) for i in ids], "margin": round(float(lp[ids[0]] - lp[ids[1]]), 7)}


def cera_ids(cmd, text):
    """Token ids of `text` from cera's own tokenizer (BOS added, as the engine does)."""
    out = subprocess.run(shlex.split(cmd) + ["tokenize", "--ids-only", "-f", "-", "gemma3-270m"], input=text.encode(), capture_output=True, check=True)
    return [int(t) for t in out.stdout.split()]


def check_llama_cpp(model, steps):
    g = json.load(open(ROOT / "tests/golden/generation/gemma3-270m.json"))
    for c in g["cases"]:
        prompt, gen = c["prompt_ids"], c["generated_ids"][:steps]
        model.reset()
        hs = model.forward(prompt + gen[:-1])
        worst, worst_rel, agree, clear = 0.0, 0.0, 0, 0
        for i in range(len(gen)):
            lp = model.logprobs(hs[len(prompt) - 1 + i])
            for j, t in enumerate(c["top_ids"][i]):
                d = abs(lp[t] - c["top_logprobs"][i][j])
                worst = max(worst, d)
                worst_rel = max(worst_rel, d / (0.5 + 0.15 * abs(c["top_logprobs"][i][j])))
            if c["margins"][i] > 0.6:
                clear += 1
                agree += int(lp.argmax()) == gen[i]
        print(f"{c['name']:16} {len(prompt):4} prompt tokens, {len(gen)} steps: largest top-5 logprob difference to llama.cpp "
              f"{worst:.3f} ({worst_rel:.2f} of engine_cpu.rs's 0.5 + 0.15|lp|); argmax equal at {agree} of {clear} clear steps")


def main():
    ap = argparse.ArgumentParser()
    cache = os.environ.get("CERA_MODEL_CACHE", os.path.expanduser("~/.cache/cera/models"))
    ap.add_argument("--model", default=os.path.join(cache, "gemma-3-270m-Q4_K_M.gguf"))
    ap.add_argument("--cera", default="cargo run -q -p cera --release --", help="command that runs the cera binary")
    ap.add_argument("--tokens", type=int, default=640)
    ap.add_argument("--positions", default="100,300,510,511,512,513")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--check-llama-cpp", action="store_true")
    a = ap.parse_args()
    if not a.check_llama_cpp:
        ids = cera_ids(a.cera, PROMPT)
        assert len(ids) >= a.tokens, f"the prompt has {len(ids)} tokens, fewer than {a.tokens}"
        ids = ids[:a.tokens]
    model = Gemma3(a.model)
    print(model.describe())
    if a.check_llama_cpp:
        check_llama_cpp(model, a.steps)
        return
    positions = [int(p) for p in a.positions.split(",")] + [a.tokens - 1]
    hs = model.forward(ids)
    checks = [{"pos": p, **top(model.logprobs(hs[p]))} for p in positions]
    # Greedy decode: the argmax after the prompt is fed at position `tokens`, and so on.
    decode = []
    tok = checks[-1]["ids"][0]
    for i in range(a.steps):
        h = model.forward([tok])[0]
        decode.append({"pos": a.tokens + i, "input": tok, **top(model.logprobs(h))})
        tok = decode[-1]["ids"][0]
    sha = hashlib.sha256(open(a.model, "rb").read()).hexdigest()
    out = {
        "model": os.path.basename(a.model),
        "model_sha256": sha,
        "reference": "numpy float64 over gguf-py dequantization (scripts/make_gemma_f64_goldens.py)",
        "config": model.describe(),
        "prompt_text": PROMPT,
        "prompt_ids_from": f"cera tokenize --ids-only (BOS added), the first {a.tokens} ids",
        "prompt_ids": ids,
        "logprobs": "natural-log softmax over the whole vocabulary; top 5 ids, descending; margin = top-1 minus top-2",
        "prefill": checks,
        "decode": decode,
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for c in checks + decode:
        print(c["pos"], c["ids"][0], c["logprobs"][0], c["margin"])
    print(f"wrote {OUT}")


main()
