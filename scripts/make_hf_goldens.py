#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints and transformers' own outputs for them, for cera's
safetensors path (`cera/tests/hf_goldens.rs`).

For each architecture (llama, qwen2, qwen3, lfm2, gemma3), and llama with AWQ (group 32) and
GPTQ (group 128, v1 zeros, sequential `g_idx`) int4 linears, this writes `OUT/<name>/`:
- `config.json`, `model.safetensors` (the weights in the dtype named below), `tokenizer.json`,
  `tokenizer_config.json` (ChatML template, special tokens), `generation_config.json` (EOS);
- `golden.json`: per prompt its text, transformers' token ids, the greedy continuation of
  `generate(do_sample=False)`, and where its logits sit in `logits.bin`;
- `logits.bin`: transformers' f32 logits for every position of every prompt (little-endian,
  `[n_tokens, vocab]` per prompt, prompts in order).

The models are random but not degenerate: every matrix is normal with std `1 / sqrt(fan_in)`
(so activations keep unit scale through the layers), embedding rows of RMS 0.1 in the residual
stream (else the input token's own row dominates and greedy decoding repeats it), norm weights `1 + 0.1 N(0, 1)` (gemma3:
`0.1 N(0, 1)`, its norms compute `1 + w`), biases `0.5 N(0, 1)`, conv taps `0.5 N(0, 1)`. They
are stored in the checkpoint's dtype (f16 / bf16 / f32) and the reference runs those stored
values in f32 (`model.float()`), so the checkpoint holds exactly what the reference ran.

The tokenizer is our own: a byte-level BPE of 320 tokens (256 bytes, 3 special tokens, merges
learned from `CORPUS`), the same for every model. Layers include an LFM2 conv block (layers 0 and
2) and a Gemma 3 sliding-window layer (layer 0, window 4, shorter than every long prompt);
`gemma3-6l-tiny` has llama.cpp's Gemma 3 pattern (layers 0..4 sliding, layer 5 global), so that
its GGUF twin is exact.

Run where torch and transformers are installed (the GPU machine has both):
    python3 scripts/make_hf_goldens.py --out tests/golden/hf
or, to write only some of the models (the others' committed files stay as they are):
    python3 scripts/make_hf_goldens.py --out tests/golden/hf --only gemma3-6l-tiny
"""

import argparse
import json
import pathlib
import struct

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 320
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "Lighthouses are towers that carry a bright light to guide ships at night.",
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Once upon a time there was a small village by the sea, where fishermen mended their nets.",
    "Numbers: 1, 2, 3, 10, 42, 100, 2025. Symbols: + - * / = ( ) [ ] { }.",
] * 4
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PROMPTS = [
    "The quick brown fox",
    "Lighthouses are towers that carry a bright light to guide ships at night, and the sea is calm.",
    "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n",
]
NEW_TOKENS = 8

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    bos_token_id=None,
    eos_token_id=2,
    pad_token_id=0,
)

MODELS = [
    ("llama-tiny", "float16", lambda: transformers.LlamaConfig(**COMMON, num_hidden_layers=2, head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)),
    ("qwen2-tiny", "bfloat16", lambda: transformers.Qwen2Config(**COMMON, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
    ("qwen3-tiny", "float32", lambda: transformers.Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
    (
        "lfm2-tiny",
        "bfloat16",
        lambda: transformers.Lfm2Config(
            **COMMON,
            num_hidden_layers=3,
            layer_types=["conv", "full_attention", "conv"],
            conv_L_cache=3,
            conv_bias=False,
            block_auto_adjust_ff_dim=False,
            norm_eps=1e-5,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
        ),
    ),
    (
        "gemma3-tiny",
        "float16",
        lambda: transformers.Gemma3TextConfig(
            **COMMON,
            num_hidden_layers=2,
            head_dim=64,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=64,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rms_norm_eps=1e-6,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            tie_word_embeddings=True,
        ),
    ),
    # gemma3-tiny in six layers, five sliding-window then one global: llama.cpp's fixed Gemma 3
    # pattern (layer il slides iff il % 6 < 5), so its GGUF twin (`cargo xtask hf2gguf`) is the
    # same model. FFN width 128 keeps it under 1.5 MB.
    (
        "gemma3-6l-tiny",
        "float16",
        lambda: transformers.Gemma3TextConfig(
            **{**COMMON, "intermediate_size": 128},
            num_hidden_layers=6,
            head_dim=64,
            sliding_window=4,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            query_pre_attn_scalar=64,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rms_norm_eps=1e-6,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            tie_word_embeddings=True,
        ),
    ),
]


# llama-tiny's shape with its decoder linears in int4 (embedding, norms and LM head F16).
INT4 = [("llama-tiny-awq", "awq", 32), ("llama-tiny-gptq", "gptq", 128)]


def tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def randomize(model, gemma, seed):
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            n = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(0.1 * n if gemma else 1.0 + 0.1 * n)
            elif name.endswith("bias"):
                p.copy_(0.5 * n)
            elif "conv.conv" in name or p.dim() == 3:
                p.copy_(0.5 * n)
            elif "embed_tokens" in name:
                # Rows of RMS 0.1 in the residual stream (gemma3 scales them by sqrt(hidden)), so
                # the blocks' outputs (RMS about 1) decide the next token, not a copy of the input.
                p.copy_(0.1 * n / (p.shape[1] ** 0.5 if gemma else 1.0))
            elif p.dim() == 2:
                p.copy_(n / p.shape[1] ** 0.5)
            else:
                p.copy_(n)


LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_int4(w, group):
    """Asymmetric 4-bit quantization per group of `group` inputs: `w` [N, K] to codes q [K, N],
    zeros z [K/G, N] (1..15, so that GPTQ v1's stored `z - 1` is a nibble) and f16 scales
    s [K/G, N]; returns them with the dequantized `(q - z) * s` [N, K] in f32."""
    n, k = w.shape
    wg = w.t().reshape(k // group, group, n)
    lo, hi = wg.min(dim=1).values.clamp(max=0), wg.max(dim=1).values.clamp(min=0)
    s = ((hi - lo) / 15).clamp(min=1e-4).half().float()
    z = torch.round(-lo / s).clamp(1, 15)
    q = torch.round(wg / s[:, None, :] + z[:, None, :]).clamp(0, 15)
    deq = ((q - z[:, None, :]) * s[:, None, :]).reshape(k, n).t().contiguous()
    return q.reshape(k, n).to(torch.int64).contiguous(), z.to(torch.int64).contiguous(), s.half().contiguous(), deq


def pack(nibbles, shifts):
    """int32 words from the last axis of `nibbles` in runs of 8, nibble `c` at `shifts[c]`."""
    *lead, m = nibbles.shape
    x = nibbles.reshape(*lead, m // 8, 8)
    words = sum(x[..., c] << shifts[c] for c in range(8))
    return (words & 0xFFFFFFFF).to(torch.int64).numpy().astype("uint32").view("int32")


AWQ_SHIFTS = [0, 16, 4, 20, 8, 24, 12, 28]
SEQ_SHIFTS = [0, 4, 8, 12, 16, 20, 24, 28]


def save_int4(model, d, stored, method, group):
    """The checkpoint of `model` with every decoder linear as AWQ (AutoAWQ GEMM) or GPTQ (v1,
    sequential g_idx) int4 tensors, quantized per `group` inputs; the model's own weights are
    replaced by the dequantized values, so the reference runs exactly what the file holds."""
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not (isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in LINEARS):
                continue
            q, z, s, deq = quantize_int4(mod.weight.float(), group)
            mod.weight.copy_(deq)
            k, n = q.shape
            if method == "awq":
                tensors[f"{name}.qweight"] = pack(q, AWQ_SHIFTS)
                tensors[f"{name}.qzeros"] = pack(z, AWQ_SHIFTS)
            else:
                tensors[f"{name}.qweight"] = pack(q.reshape(k // 8, 8, n).permute(0, 2, 1).contiguous(), SEQ_SHIFTS).reshape(k // 8, n)
                tensors[f"{name}.qzeros"] = pack(z - 1, SEQ_SHIFTS)
                tensors[f"{name}.g_idx"] = np.arange(k, dtype=np.int32) // group
            tensors[f"{name}.scales"] = s.numpy()
            # Unpack the words again, by the formats' definitions, before trusting them.
            w = tensors[f"{name}.qweight"].view("uint32").astype("int64")
            if method == "awq":
                back = np.stack([(w >> sh) & 0xF for sh in AWQ_SHIFTS], axis=-1).reshape(k, n)
                zb = np.stack([(tensors[f"{name}.qzeros"].view("uint32").astype("int64") >> sh) & 0xF for sh in AWQ_SHIFTS], axis=-1).reshape(k // group, n)
            else:
                back = np.stack([(w >> (4 * i)) & 0xF for i in range(8)], axis=1).reshape(k, n)
                zb = 1 + np.stack([(tensors[f"{name}.qzeros"].view("uint32").astype("int64") >> (4 * i)) & 0xF for i in range(8)], axis=-1).reshape(k // group, n)
            assert (back == q.numpy()).all() and (zb == z.numpy()).all(), name
        for name, p in model.state_dict().items():
            if not any(name.endswith(f"{l}.weight") for l in LINEARS):
                tensors[name] = p.to(stored).numpy()
    # safetensors.numpy writes an array's buffer as it lies: make every one C-contiguous.
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    if method == "awq":
        cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    else:
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": False, "checkpoint_format": "gptq"}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def decode_linear(t, name, q):
    """A linear's [out, in] f32 weight from the checkpoint's tensors `t`, by the formats'
    definitions (independent of `quantize_int4` and `pack`)."""
    import numpy as np

    if q is None:
        return t[f"{name}.weight"].astype("float32")
    method, group = q
    u = lambda x: x.view("uint32").astype("int64")
    qw, qz, sc = u(t[f"{name}.qweight"]), u(t[f"{name}.qzeros"]), t[f"{name}.scales"].astype("float32")
    if method == "awq":
        codes = np.stack([(qw >> sh) & 0xF for sh in AWQ_SHIFTS], axis=-1).reshape(qw.shape[0], -1)
        zeros = np.stack([(qz >> sh) & 0xF for sh in AWQ_SHIFTS], axis=-1).reshape(qz.shape[0], -1)
    else:
        codes = np.stack([(qw >> (4 * i)) & 0xF for i in range(8)], axis=1).reshape(qw.shape[0] * 8, -1)
        zeros = 1 + np.stack([(qz >> (4 * i)) & 0xF for i in range(8)], axis=-1).reshape(qz.shape[0], -1)
    return ((codes - np.repeat(zeros, group, 0)) * np.repeat(sc, group, 0)).T


def check_llama(d, model, q):
    """The checkpoint's linears against the reference model's weights (llama-shaped models)."""
    from safetensors.numpy import load_file

    t = load_file(str(d / "model.safetensors"))
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name.split(".")[-1] in LINEARS:
            w = decode_linear(t, name, q)
            err = abs(w - mod.weight.detach().numpy()).max()
            assert err == 0, f"{d.name}: {name} differs from the reference's weight by {err}"


def make(out, name, dtype, config_fn, tok, seed, quant=None):
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    cfg = config_fn()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    randomize(model, name.startswith("gemma3"), seed)
    stored = getattr(torch, dtype)
    # Round the parameters to the stored dtype in place: the model stays f32 (its buffers too:
    # `model.to(dtype)` would also round RoPE's inverse frequencies and Gemma's embedding scale,
    # which transformers computes in f32), and runs exactly the values the checkpoint holds.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(stored).float())
    model = model.eval()
    if quant is None:
        model.save_pretrained(d, state_dict={k: v.to(stored) for k, v in model.state_dict().items()}, safe_serialization=True)
    else:
        save_int4(model, d, stored, *quant)
    if name.startswith("llama"):
        check_llama(d, model, quant)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHATML,
                "model_max_length": 256,
            },
            indent=2,
        )
    )
    cases = []
    blob = bytearray()
    for text in PROMPTS:
        ids = tok.encode(text).ids
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x).logits[0].float().contiguous()
            gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=COMMON["eos_token_id"], pad_token_id=0)
        cont = gen[0, len(ids) :].tolist()
        cases.append({"text": text, "ids": ids, "generated": cont, "logits_offset": len(blob) // 4, "n_tokens": len(ids)})
        blob += struct.pack(f"<{logits.numel()}f", *logits.flatten().tolist())
    (d / "logits.bin").write_bytes(bytes(blob))
    golden = {
        "model": name,
        "dtype": dtype,
        "vocab": VOCAB,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": seed,
        "cases": cases,
    }
    (d / "golden.json").write_text(json.dumps(golden, indent=1))
    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"{name}: {dtype}, {size / 1e6:.2f} MB, generated {[c['generated'] for c in cases]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/golden/hf")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=[m[0] for m in MODELS] + [m[0] for m in INT4], help="write only these models")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    tok = tokenizer()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for i, (name, dtype, cfg) in enumerate(MODELS):
        if args.only is None or name in args.only:
            make(out, name, dtype, cfg, tok, 100 + i)
    for i, (name, method, group) in enumerate(INT4):
        if args.only is None or name in args.only:
            make(out, name, "float16", MODELS[0][2], tok, 200 + i, (method, group))


if __name__ == "__main__":
    main()
