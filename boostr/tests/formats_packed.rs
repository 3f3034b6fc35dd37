//! The packed GPU layout against the reference dequantization, on random blocks and awkward
//! shapes, for every supported format; plus the layout's geometry and its typed errors.

#[path = "formats_util.rs"]
mod util;

use boostr::formats::{AwqTensors, FormatError, GgmlType, GptqTensors, GptqZeroOffset, PackedFormat, dequantize, dequantize_row, repack};
use util::{Rng, random_tensor};

fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i}: got {} want {}", got[i], want[i]);
    }
}

/// (rows, blocks per row): a single block, odd counts, more rows than blocks and the reverse.
const SHAPES: [(usize, usize); 5] = [(1, 1), (3, 5), (7, 3), (2, 9), (5, 1)];

#[test]
fn packed_rows_equal_reference_for_every_ggml_format() {
    let mut rng = Rng(7);
    for ty in GgmlType::SUPPORTED {
        for (rows, bpr) in SHAPES {
            // Float types get odd and even row lengths, quantized types whole blocks.
            let cols = if ty.block_size() == 1 { 2 * bpr + rows % 2 } else { bpr * ty.block_size() };
            let data = random_tensor(&mut rng, ty, rows * cols);
            let p = repack(ty, &data, rows, cols).unwrap();
            assert_eq!((p.rows(), p.cols()), (rows, cols));
            assert_eq!(p.format(), PackedFormat::Ggml(ty));
            for r in 0..rows {
                let want = dequantize_row(ty, &data, cols, r).unwrap();
                let what = format!("{ty} {rows}x{cols} row {r}");
                assert_bits_eq(&what, &p.dequantize_row(r).unwrap(), &want);
            }
            let all = dequantize(ty, &data, rows * cols).unwrap();
            assert_bits_eq(&format!("{ty} {rows}x{cols}"), &p.dequantize(), &all);
        }
    }
}

#[test]
fn packed_geometry_is_word_aligned_and_lossless_in_size() {
    let mut rng = Rng(11);
    for ty in GgmlType::SUPPORTED {
        let (rows, bpr) = (3, 5);
        let cols = bpr * ty.block_size().max(2);
        let data = random_tensor(&mut rng, ty, rows * cols);
        let p = repack(ty, &data, rows, cols).unwrap();
        let nb = p.n_blocks();
        assert_eq!(nb, rows * p.blocks_per_row());
        assert_eq!(p.qs().len(), nb * p.qs_words_per_block(), "{ty}");
        assert_eq!(p.qh().len(), nb * p.qh_words_per_block(), "{ty}");
        assert_eq!(p.scales().len(), nb * p.scale_words_per_block(), "{ty}");
        for (used, len) in [(p.has_d(), p.d().len()), (p.has_m(), p.m().len())] {
            assert_eq!(len, if used { nb + nb % 2 } else { 0 }, "{ty}");
        }
        for bytes in [p.qs_bytes(), p.qh_bytes(), p.scales_bytes(), p.d_bytes(), p.m_bytes()] {
            assert_eq!(bytes.len() % 4, 0, "{ty}");
        }
        // Splitting blocks into aligned arrays costs no bytes: a row reads what the file holds.
        assert_eq!(p.bytes_per_row_read(), ty.bytes_for(cols).unwrap(), "{ty}");
        assert!(p.total_bytes() >= rows * p.bytes_per_row_read());
    }
}

#[test]
fn known_words_of_q4_0_and_q8_0() {
    // Q4_0: d = 1.0, qs[j] = j | (15 - j) << 4: element j < 16 is j, element 16 + j is 15 - j.
    let mut block = vec![0x00, 0x3C];
    block.extend((0..16u8).map(|j| j | (15 - j) << 4));
    let p = repack(GgmlType::Q4_0, &block, 1, 32).unwrap();
    // The qs bytes unchanged, as little-endian words.
    assert_eq!(p.qs(), &[0xC3D2_E1F0, 0x8796_A5B4, 0x4B5A_6978, 0x0F1E_2D3C]);
    // Masking a word yields four consecutive elements, one per byte (dot4I8Packed-ready):
    // elements 0..4 and 16..20.
    assert_eq!(p.qs()[0] & 0x0F0F_0F0F, 0x0302_0100);
    assert_eq!((p.qs()[0] >> 4) & 0x0F0F_0F0F, 0x0C0D_0E0F);
    assert_eq!(p.d()[0].to_bits(), 0x3C00);
    // Q8_0: bytes in element order, four per word.
    let mut block = vec![0x00, 0x3C];
    block.extend(0..32u8);
    let p = repack(GgmlType::Q8_0, &block, 1, 32).unwrap();
    assert_eq!(p.qs()[0], 0x0302_0100);
    assert_eq!(p.qs()[7], 0x1F1E_1D1C);
}

#[test]
fn ragged_rows_and_bad_lengths_are_typed_errors() {
    let mut rng = Rng(3);
    for ty in GgmlType::SUPPORTED.into_iter().filter(|t| t.block_size() > 1) {
        let data = random_tensor(&mut rng, ty, 2 * ty.block_size());
        let err = repack(ty, &data, 2, ty.block_size() + 1).unwrap_err();
        assert!(matches!(err, FormatError::NotBlockMultiple { .. }), "{ty}: {err}");
        let err = repack(ty, &data, 3, ty.block_size()).unwrap_err();
        assert!(matches!(err, FormatError::ByteLength { .. }), "{ty}: {err}");
        let err = dequantize(ty, &data, 3 * ty.block_size() / 2).unwrap_err();
        assert!(matches!(err, FormatError::NotBlockMultiple { .. }), "{ty}: {err}");
        let err = dequantize_row(ty, &data, ty.block_size(), 2).unwrap_err();
        assert_eq!(err, FormatError::RowOutOfRange { row: 2, rows: 2 });
        let p = repack(ty, &data, 2, ty.block_size()).unwrap();
        assert_eq!(p.dequantize_row(2).unwrap_err(), FormatError::RowOutOfRange { row: 2, rows: 2 });
    }
}

/// Random AWQ or GPTQ tensors: (qweight, qzeros, scales) bytes.
fn random_int4(rng: &mut Rng, k: usize, n: usize, g: usize, awq: bool) -> [Vec<u8>; 3] {
    let qweight_words = if awq { k * n / 8 } else { k / 8 * n };
    let qweight = rng.bytes(4 * qweight_words);
    let qzeros = rng.bytes(4 * (k / g) * (n / 8));
    let scales = (0..(k / g) * n).flat_map(|_| rng.finite_f16().to_le_bytes()).collect();
    [qweight, qzeros, scales]
}

#[test]
fn int4_packed_rows_equal_reference_transposed() {
    let mut rng = Rng(5);
    for (k, n, g) in [
        (64, 8, 32),
        (192, 24, 64),
        (384, 16, 128),
        (256, 8, 256),
        (96, 8, 32),
        (64, 136, 32), // more output columns than one repack tile
    ] {
        for awq in [true, false] {
            let [qweight, qzeros, scales] = random_int4(&mut rng, k, n, g, awq);
            let (deq, p) = if awq {
                let t = AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: k, out_features: n, group_size: g };
                (t.dequantize().unwrap(), t.repack().unwrap())
            } else {
                let g_idx: Vec<u8> = (0..k).flat_map(|i| ((i / g) as i32).to_le_bytes()).collect();
                let t = GptqTensors {
                    qweight: &qweight,
                    qzeros: &qzeros,
                    scales: &scales,
                    g_idx: Some(&g_idx),
                    in_features: k,
                    out_features: n,
                    group_size: g,
                    zero_offset: GptqZeroOffset::V1PlusOne,
                };
                (t.dequantize().unwrap(), t.repack().unwrap())
            };
            assert_eq!((p.rows(), p.cols(), p.blocks_per_row()), (n, k, k / g));
            assert_eq!(p.bytes_per_row_read(), k / 2 + 4 * (k / g));
            for row in 0..n {
                let want: Vec<f32> = (0..k).map(|kk| deq[kk * n + row]).collect();
                let what = format!("awq={awq} k={k} n={n} g={g} row {row}");
                assert_bits_eq(&what, &p.dequantize_row(row).unwrap(), &want);
            }
        }
    }
}

#[test]
fn int4_shape_errors_and_act_order() {
    let mut rng = Rng(9);
    let (k, n, g) = (128, 16, 32);
    let [qweight, qzeros, scales] = random_int4(&mut rng, k, n, g, false);
    let mut t = GptqTensors {
        qweight: &qweight,
        qzeros: &qzeros,
        scales: &scales,
        g_idx: None,
        in_features: k,
        out_features: n,
        group_size: g,
        zero_offset: GptqZeroOffset::default(),
    };
    assert!(t.dequantize().is_ok());
    // An act-order g_idx (groups not in input order) is rejected, naming the first mismatch.
    let g_idx: Vec<u8> = (0..k).flat_map(|i| ((i % (k / g)) as i32).to_le_bytes()).collect();
    t.g_idx = Some(&g_idx);
    assert_eq!(t.repack().unwrap_err(), FormatError::ActOrder { k: 1, found: 1, expected: 0 });
    t.g_idx = None;
    t.group_size = 48; // does not divide K
    assert!(matches!(t.dequantize().unwrap_err(), FormatError::InvalidShape { format: "GPTQ", .. }));
    t.group_size = 16; // not a multiple of 32
    assert!(matches!(t.repack().unwrap_err(), FormatError::InvalidShape { .. }));
    t.group_size = g;
    t.scales = &scales[2..];
    assert!(matches!(t.dequantize().unwrap_err(), FormatError::ByteLength { what: "scales", .. }));
    let a = AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: k, out_features: 12, group_size: g };
    assert!(matches!(a.repack().unwrap_err(), FormatError::InvalidShape { format: "AWQ", .. }));
}
