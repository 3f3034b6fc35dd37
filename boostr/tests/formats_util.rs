//! Shared helpers of the `formats_*` tests: golden readers and a small seeded RNG.
//! Included by the other test files with `#[path = "formats_util.rs"] mod util;`.
#![allow(dead_code)]

use boostr::formats::{GgmlType, PackedWeights, repack};
use std::path::PathBuf;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/formats")
}

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A GGUF golden: raw blocks and gguf-py's dequantization of them.
pub struct GgufGolden {
    pub ty: GgmlType,
    pub n_blocks: usize,
    pub data: Vec<u8>,
    pub expected: Vec<f32>,
}

pub fn read_gguf_golden(ty: GgmlType) -> GgufGolden {
    let path = golden_dir().join(format!("{}.bin", ty.name().to_lowercase()));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[0..4], b"BFG1", "{}", path.display());
    assert_eq!(u32_at(&b, 4) as u32, ty.id());
    let (n_blocks, type_size, n) = (u32_at(&b, 8), u32_at(&b, 12), u32_at(&b, 16));
    assert_eq!(type_size, ty.type_size());
    let data_end = 20 + n_blocks * type_size;
    assert_eq!(b.len(), data_end + 4 * n);
    GgufGolden { ty, n_blocks, data: b[20..data_end].to_vec(), expected: f32s(&b[data_end..]) }
}

/// An AWQ/GPTQ golden.
pub struct Int4Golden {
    /// 0 AWQ, 1 GPTQ v1, 2 GPTQ v2.
    pub scheme: u32,
    pub k: usize,
    pub n: usize,
    pub group: usize,
    pub qweight: Vec<u8>,
    pub qzeros: Vec<u8>,
    pub scales: Vec<u8>,
    pub g_idx: Option<Vec<u8>>,
    /// `[K, N]`.
    pub expected: Vec<f32>,
}

pub fn read_int4_golden(name: &str) -> Int4Golden {
    let path = golden_dir().join(format!("{name}.bin"));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[0..4], b"BI4G");
    let scheme = u32_at(&b, 4) as u32;
    let (k, n, group, has_g) = (u32_at(&b, 8), u32_at(&b, 12), u32_at(&b, 16), u32_at(&b, 20));
    let mut at = 24;
    let mut take = |len: usize| {
        let s = b[at..at + len].to_vec();
        at += len;
        s
    };
    let qweight = take(k * n / 2);
    let qzeros = take(k / group * n / 2);
    let scales = take(k / group * n * 2);
    let g_idx = (has_g == 1).then(|| take(k * 4));
    let expected = f32s(&take(k * n * 4));
    assert_eq!(at, b.len());
    Int4Golden { scheme, k, n, group, qweight, qzeros, scales, g_idx, expected }
}

/// splitmix64: a tiny deterministic generator for random blocks.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A random f16 bit pattern that is neither Inf nor NaN.
    pub fn finite_f16(&mut self) -> u16 {
        let b = self.next_u64() as u16;
        if b & 0x7C00 == 0x7C00 { b & 0xBFFF } else { b }
    }

    pub fn f32_in(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// Byte offsets of the f16 scale fields in a block of `ty`.
pub fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// Random file bytes for `n_elements` of `ty`: random quants, finite f16 scales, finite floats.
pub fn random_tensor(rng: &mut Rng, ty: GgmlType, n_elements: usize) -> Vec<u8> {
    let n_blocks = n_elements / ty.block_size();
    match ty {
        GgmlType::F32 => (0..n_elements)
            .flat_map(|_| {
                let mut b = rng.next_u64() as u32;
                if b & 0x7F80_0000 == 0x7F80_0000 {
                    b &= 0xBFFF_FFFF;
                }
                b.to_le_bytes()
            })
            .collect(),
        GgmlType::F16 => (0..n_elements).flat_map(|_| rng.finite_f16().to_le_bytes()).collect(),
        GgmlType::BF16 => (0..n_elements)
            .flat_map(|_| {
                let mut b = rng.next_u64() as u16;
                if b & 0x7F80 == 0x7F80 {
                    b &= 0xBFFF;
                }
                b.to_le_bytes()
            })
            .collect(),
        _ => {
            let ts = ty.type_size();
            let mut data = rng.bytes(n_blocks * ts);
            for block in data.chunks_exact_mut(ts) {
                for &off in f16_fields(ty) {
                    block[off..off + 2].copy_from_slice(&rng.finite_f16().to_le_bytes());
                }
            }
            data
        }
    }
}

/// Two little-endian bytes of a random f16 in `[lo, hi)` (finite scale fields for random blocks).
pub fn small_f16(rng: &mut Rng, lo: f32, hi: f32) -> [u8; 2] {
    half::f16::from_f32(rng.f32_in(lo, hi)).to_bits().to_le_bytes()
}

/// A random `rows x cols` weight of `ty` with modest scales (so f16 math stays in range),
/// in the packed GPU layout.
pub fn random_ggml(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> PackedWeights {
    let n = rows * cols;
    let bytes: Vec<u8> = match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.f32_in(-1.0, 1.0).to_le_bytes()).collect(),
        GgmlType::F16 => (0..n).flat_map(|_| small_f16(rng, -1.0, 1.0)).collect(),
        GgmlType::BF16 => (0..n).flat_map(|_| ((rng.f32_in(-1.0, 1.0).to_bits() >> 16) as u16).to_le_bytes()).collect(),
        _ => {
            let ts = ty.type_size();
            let mut data = rng.bytes(n / ty.block_size() * ts);
            for block in data.chunks_exact_mut(ts) {
                for &off in f16_fields(ty) {
                    block[off..off + 2].copy_from_slice(&small_f16(rng, 0.002, 0.02));
                }
            }
            data
        }
    };
    repack(ty, &bytes, rows, cols).unwrap()
}

/// Checks int8 activations (`q`, and `s` = `vec4(d, d * sum lo, d * sum hi, 0)` per block of 32)
/// against the values `x` they quantize: `d = max|x| / 127` (to `rel` of max|x|), every
/// `|x - d q| <= d / 2` (plus `rel` of max|x|), and the half sums. Returns the dequantized values.
pub fn check_q8(x: &[f32], q: &[i8], s: &[f32], rel: f32) -> Vec<f32> {
    let mut deq = vec![0f32; x.len()];
    for b in 0..x.len() / 32 {
        let blk = &x[b * 32..b * 32 + 32];
        let am = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = s[4 * b];
        assert!((d - am / 127.0).abs() <= rel.max(1e-6) * am, "block {b}: d {d} vs max {am}");
        for e in 0..32 {
            let qv = q[b * 32 + e] as f32;
            assert!((blk[e] - d * qv).abs() <= d * 0.5001 + rel * am + 1e-7, "block {b} element {e}: {} vs {} * {qv}", blk[e], d);
            deq[b * 32 + e] = d * qv;
        }
        for h in 0..2 {
            let sum: i32 = q[b * 32 + 16 * h..b * 32 + 16 * h + 16].iter().map(|&v| v as i32).sum();
            assert!((s[4 * b + 1 + h] - d * sum as f32).abs() <= 1e-5 * d * 16.0 * 127.0);
        }
    }
    deq
}

/// RMSNorm of `m` rows by `w` (`1 + w` with `gemma`), in f64.
pub fn rmsnorm_cpu(x: &[f32], w: &[f32], m: usize, eps: f32, gemma: bool) -> Vec<f32> {
    let k = w.len();
    let mut out = vec![0.0; m * k];
    for i in 0..m {
        let row = &x[i * k..(i + 1) * k];
        let inv = 1.0 / (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / k as f64 + eps as f64).sqrt();
        for c in 0..k {
            let g = if gemma { 1.0 + w[c] as f64 } else { w[c] as f64 };
            out[i * k + c] = (row[c] as f64 * inv * g) as f32;
        }
    }
    out
}
