#!/usr/bin/env python3
"""Goldens for tests/tests/real_model_tensors.rs: gguf-py reads the real SmolLM2-135M Q4_1 file on
its own and dequantizes a few tensors of each type; the test checks that cera's GGUF reader plus
boostr's dequantization give the same values.

Usage: python3 scripts/make_model_goldens.py MODEL_DIR
MODEL_DIR holds SmolLM2-135M-Instruct.Q4_1.gguf and gemma-3-270m-Q4_K_M.gguf (`pip install gguf
numpy`; `cargo run -p cera -- fetch smollm2-135m` and `fetch gemma3-270m` put them in
~/.cache/cera/models).
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", ["token_embd.weight", "blk.0.attn_q.weight", "blk.7.ffn_down.weight", "blk.29.attn_v.weight", "output_norm.weight", "blk.3.attn_norm.weight"]),
    "gemma3": ("gemma-3-270m-Q4_K_M.gguf", None),
}


def goldens(path, names):
  reader = GGUFReader(path)
  out = []
  seen_types = set()
  for t in reader.tensors:
      if names is not None and t.name not in names:
          continue
      # Without a list: the embedding, plus the first tensor of every other type.
      if names is None and t.name != "token_embd.weight" and t.tensor_type.name in seen_types:
          continue
      seen_types.add(t.tensor_type.name)
      deq = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
      rows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
      cols = int(t.shape[0])
      picks = sorted({0, min(1, rows - 1), rows // 2, rows - 1})
      out.append({
          "name": t.name,
          "type": t.tensor_type.name,
          "dims": [int(d) for d in t.shape],
          "sum": float(deq.astype(np.float64).sum()),
          "abs_sum": float(np.abs(deq.astype(np.float64)).sum()),
          "rows": {str(r): [float(v) for v in deq[r * cols:r * cols + 64]] for r in picks},
      })
  return out


for key, (file, names) in MODELS.items():
    out = goldens(f"{sys.argv[1]}/{file}", names)
    json.dump({"model": file, "tensors": out}, open(f"tests/golden/model/{key}_tensors.json", "w"), indent=1)
    print(f"{key}: {len(out)} tensors: {[(t['name'], t['type']) for t in out]}")
