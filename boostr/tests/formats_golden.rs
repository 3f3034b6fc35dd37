//! Format goldens: the reference dequantization against gguf-py (GGUF types) and against the
//! numpy reference of `scripts/formats/make_goldens.py` (AWQ/GPTQ), bit for bit; and the packed
//! GPU layout's decoder against the same goldens.

#[path = "formats_util.rs"]
mod util;

use boostr::formats::{AwqTensors, GgmlType, GptqTensors, GptqZeroOffset, PackedWeights, dequantize, dequantize_row, repack};
use util::{read_gguf_golden, read_int4_golden};

/// Asserts `got == want` bit for bit (f32::to_bits), naming the first difference.
fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i} differs: got {} ({:#010x}), want {} ({:#010x})", got[i], got[i].to_bits(), want[i], want[i].to_bits());
    }
}

#[test]
fn gguf_reference_matches_gguf_py_bit_exactly() {
    for ty in GgmlType::SUPPORTED {
        let g = read_gguf_golden(ty);
        let got = dequantize(ty, &g.data, g.expected.len()).unwrap();
        assert_bits_eq(ty.name(), &got, &g.expected);
    }
}

#[test]
fn gguf_rows_match_gguf_py_bit_exactly() {
    for ty in GgmlType::SUPPORTED {
        let g = read_gguf_golden(ty);
        // Two blocks per row for the quantized types, 32 elements per row for the floats.
        let cols = if ty.block_size() == 1 { 32 } else { 2 * ty.block_size() };
        let rows = g.expected.len() / cols;
        for r in 0..rows {
            let got = dequantize_row(ty, &g.data, cols, r).unwrap();
            assert_bits_eq(ty.name(), &got, &g.expected[r * cols..(r + 1) * cols]);
        }
    }
}

#[test]
fn gguf_packed_decoder_matches_gguf_py_bit_exactly() {
    for ty in GgmlType::SUPPORTED {
        let g = read_gguf_golden(ty);
        let n = g.expected.len();
        // One row, then every split into whole blocks per row.
        for blocks_per_row in [g.n_blocks, 1, 2, 4] {
            let cols = blocks_per_row * ty.block_size();
            let rows = n / cols;
            let p = repack(ty, &g.data, rows, cols).unwrap();
            assert_bits_eq(&format!("{ty} packed {rows}x{cols}"), &p.dequantize(), &g.expected);
        }
    }
}

fn int4_cases() -> Vec<(&'static str, u32)> {
    vec![("awq_g32", 0), ("awq_g64", 0), ("awq_g128", 0), ("gptq_g32", 1), ("gptq_g64", 1), ("gptq_g128", 1), ("gptq_v2_g128", 2)]
}

/// Dequantizes and repacks one AWQ/GPTQ golden.
fn run_int4(name: &str) -> (util::Int4Golden, Vec<f32>, PackedWeights) {
    let g = read_int4_golden(name);
    let (deq, packed) = if g.scheme == 0 {
        let t = AwqTensors { qweight: &g.qweight, qzeros: &g.qzeros, scales: &g.scales, in_features: g.k, out_features: g.n, group_size: g.group };
        (t.dequantize().unwrap(), t.repack().unwrap())
    } else {
        let t = GptqTensors {
            qweight: &g.qweight,
            qzeros: &g.qzeros,
            scales: &g.scales,
            g_idx: g.g_idx.as_deref(),
            in_features: g.k,
            out_features: g.n,
            group_size: g.group,
            zero_offset: if g.scheme == 1 { GptqZeroOffset::default() } else { GptqZeroOffset::V2AsStored },
        };
        (t.dequantize().unwrap(), t.repack().unwrap())
    };
    (g, deq, packed)
}

#[test]
fn int4_reference_matches_numpy_bit_exactly() {
    for (name, scheme) in int4_cases() {
        let (g, deq, _) = run_int4(name);
        assert_eq!(g.scheme, scheme, "{name}");
        assert_bits_eq(name, &deq, &g.expected);
    }
}

#[test]
fn int4_packed_decoder_matches_numpy_bit_exactly() {
    for (name, _) in int4_cases() {
        let (g, _, p) = run_int4(name);
        assert_eq!((p.rows(), p.cols(), p.block_size()), (g.n, g.k, g.group), "{name}");
        for n in 0..g.n {
            let want: Vec<f32> = (0..g.k).map(|k| g.expected[k * g.n + n]).collect();
            assert_bits_eq(&format!("{name} row {n}"), &p.dequantize_row(n).unwrap(), &want);
        }
    }
}

#[test]
fn gptq_default_zero_offset_is_v1_plus_one() {
    assert_eq!(GptqZeroOffset::default(), GptqZeroOffset::V1PlusOne);
    // The v1 golden decoded as v2 differs by exactly one scale per element.
    let g = read_int4_golden("gptq_g64");
    let t = GptqTensors {
        qweight: &g.qweight,
        qzeros: &g.qzeros,
        scales: &g.scales,
        g_idx: None,
        in_features: g.k,
        out_features: g.n,
        group_size: g.group,
        zero_offset: GptqZeroOffset::V2AsStored,
    };
    let v2 = t.dequantize().unwrap();
    let scales: Vec<f32> = g.scales.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
    for k in 0..g.k {
        for n in 0..g.n {
            let s = scales[(k / g.group) * g.n + n];
            assert_eq!(v2[k * g.n + n], g.expected[k * g.n + n] + s, "k={k} n={n}");
        }
    }
}
