#!/usr/bin/env python3
"""Writes the weight-format goldens in boostr/tests/golden/formats/.

GGUF goldens: random blocks of each supported ggml type, dequantized by gguf-py
(`gguf.quants.dequantize`), the outside oracle. AWQ/GPTQ goldens: random int4 matrices packed
and dequantized by the numpy reference below, written from the formats' definitions.

Usage: pip install gguf numpy && python3 scripts/formats/make_goldens.py
The output is deterministic (fixed seeds). The file formats are described in
boostr/tests/golden/formats/README.md.
"""

import pathlib
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

OUT = pathlib.Path(__file__).resolve().parents[2] / "boostr" / "tests" / "golden" / "formats"

# Byte offsets of the f16 scale fields in each block, which get finite values.
# Everything else in a block is uniformly random bytes.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
FLOATS = [T.F32, T.F16, T.BF16]


def finite_f16_bits(rng, n):
    """Random f16 bit patterns of every kind except Inf/NaN (zeros, subnormals included)."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    inf_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_nan] &= np.uint16(0xBFFF)  # clear the top exponent bit
    return bits


def random_data(rng, qtype, n_blocks):
    if qtype == T.F32:
        bits = rng.integers(0, 1 << 32, size=n_blocks, dtype=np.uint64).astype(np.uint32)
        inf_nan = (bits & 0x7F800000) == 0x7F800000
        bits[inf_nan] &= np.uint32(0xBFFFFFFF)
        return bits.view(np.uint8)
    if qtype == T.F16:
        return finite_f16_bits(rng, n_blocks).view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 1 << 16, size=n_blocks, dtype=np.uint32).astype(np.uint16)
        inf_nan = (bits & 0x7F80) == 0x7F80
        bits[inf_nan] &= np.uint16(0xBFFF)
        return bits.view(np.uint8)
    type_size = GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint16).astype(np.uint8)
    for off in F16_FIELDS[qtype]:
        blocks[:, off:off + 2] = finite_f16_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


def write_gguf_golden(qtype, n_blocks, seed):
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = random_data(rng, qtype, n_blocks)
    assert data.size == n_blocks * type_size
    expected = np.asarray(dequantize(data, qtype), dtype=np.float32).reshape(-1)
    assert expected.size == n_blocks * block_size
    header = b"BFG1" + struct.pack("<4I", int(qtype), n_blocks, type_size, expected.size)
    path = OUT / f"{qtype.name.lower()}.bin"
    path.write_bytes(header + data.tobytes() + expected.astype("<f4").tobytes())
    return path


AWQ_SHIFTS = [0, 16, 4, 20, 8, 24, 12, 28]  # bit shift of column c within a word


def pack_awq(m):
    """[R, C] nibbles -> [R, C/8] words; column 8j + c of word j at shift AWQ_SHIFTS[c]."""
    r, c = m.shape
    words = np.zeros((r, c // 8), dtype=np.uint32)
    for col in range(8):
        words |= m[:, col::8].astype(np.uint32) << np.uint32(AWQ_SHIFTS[col])
    return words


def pack_seq_cols(m):
    """[R, C] nibbles -> [R, C/8] words; column 8j + i of word j at shift 4i (GPTQ qzeros)."""
    r, c = m.shape
    words = np.zeros((r, c // 8), dtype=np.uint32)
    for i in range(8):
        words |= m[:, i::8].astype(np.uint32) << np.uint32(4 * i)
    return words


def pack_gptq_qweight(q):
    """[K, N] nibbles -> [K/8, N] words; input 8r + i of word (r, n) at shift 4i."""
    k, n = q.shape
    words = np.zeros((k // 8, n), dtype=np.uint32)
    for i in range(8):
        words |= q[i::8, :].astype(np.uint32) << np.uint32(4 * i)
    return words


SCHEMES = {"awq": 0, "gptq": 1, "gptq_v2": 2}


def write_int4_golden(scheme, k, n, group, with_g_idx, seed):
    rng = np.random.default_rng(seed)
    groups = k // group
    q = rng.integers(0, 16, size=(k, n), dtype=np.int32)
    z_stored = rng.integers(0, 16, size=(groups, n), dtype=np.int32)
    scales = finite_f16_bits(rng, groups * n).view(np.float16).reshape(groups, n)
    # w[k][n] = (q[k][n] - z[g][n]) * s[g][n], g = k // group; GPTQ v1 stores z - 1.
    z_eff = z_stored + (1 if scheme == "gptq" else 0)
    g_of_k = np.arange(k) // group
    expected = (q - z_eff[g_of_k, :]).astype(np.float32) * scales[g_of_k, :].astype(np.float32)
    if scheme == "awq":
        qweight = pack_awq(q)
        qzeros = pack_awq(z_stored)
    else:
        qweight = pack_gptq_qweight(q)
        qzeros = pack_seq_cols(z_stored)
    g_idx = g_of_k.astype("<i4").tobytes() if with_g_idx else b""
    header = b"BI4G" + struct.pack("<5I", SCHEMES[scheme], k, n, group, int(with_g_idx))
    body = qweight.astype("<u4").tobytes() + qzeros.astype("<u4").tobytes()
    body += scales.astype("<f2").tobytes() + g_idx + expected.astype("<f4").tobytes()
    path = OUT / f"{scheme}_g{group}.bin"
    path.write_bytes(header + body)
    return path


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, qtype in enumerate(FLOATS + LEGACY + KQUANTS):
        n_blocks = 256 if qtype in FLOATS else 16 if qtype in LEGACY else 8
        paths.append(write_gguf_golden(qtype, n_blocks, seed=1000 + i))
    cases = [
        ("awq", 32, 32, False), ("awq", 64, 32, False), ("awq", 128, 64, False),
        ("gptq", 32, 32, True), ("gptq", 64, 32, False), ("gptq", 128, 64, True),
        ("gptq_v2", 128, 32, True),
    ]
    for i, (scheme, group, n, with_g_idx) in enumerate(cases):
        paths.append(write_int4_golden(scheme, 256, n, group, with_g_idx, seed=2000 + i))
    total = sum(p.stat().st_size for p in paths)
    for p in paths:
        print(f"{p.name:16} {p.stat().st_size:7} bytes")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
