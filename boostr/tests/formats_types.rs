//! ggml type metadata, unsupported types, and hand-computed reference values.

use boostr::formats::{AwqTensors, FormatError, GgmlType, GptqTensors, GptqZeroOffset, dequantize, repack};

#[test]
fn ggml_ids_and_block_geometry() {
    let expect = [
        (0, "F32", 1, 4),
        (1, "F16", 1, 2),
        (2, "Q4_0", 32, 18),
        (3, "Q4_1", 32, 20),
        (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24),
        (8, "Q8_0", 32, 34),
        (10, "Q2_K", 256, 84),
        (11, "Q3_K", 256, 110),
        (12, "Q4_K", 256, 144),
        (13, "Q5_K", 256, 176),
        (14, "Q6_K", 256, 210),
        (30, "BF16", 1, 2),
    ];
    for (id, name, bs, ts) in expect {
        let t = GgmlType::from_ggml_id(id).unwrap();
        assert_eq!((t.id(), t.name(), t.block_size(), t.type_size()), (id, name, bs, ts));
        assert!(t.is_supported());
    }
    assert_eq!(GgmlType::SUPPORTED.len(), expect.len());
}

#[test]
fn unsupported_types_name_themselves() {
    for (id, name) in [(16, "IQ2_XXS"), (20, "IQ4_NL"), (23, "IQ4_XS"), (29, "IQ1_M"), (9, "Q8_1"), (35, "TQ2_0"), (39, "MXFP4")] {
        let t = GgmlType::from_ggml_id(id).unwrap();
        assert_eq!(t.name(), name);
        let want = FormatError::Unsupported { format: name };
        let bytes = vec![0u8; t.type_size()];
        assert_eq!(dequantize(t, &bytes, t.block_size()).unwrap_err(), want);
        assert_eq!(repack(t, &bytes, 1, t.block_size()).unwrap_err(), want);
        assert!(want.to_string().contains(name));
    }
    // Removed types are known (a GGUF reader can size and name them) and never supported.
    let t = GgmlType::from_ggml_id(31).unwrap();
    assert!(t.is_removed() && !t.is_supported());
    assert_eq!(t.ensure_supported(), Err(FormatError::Unsupported { format: "Q4_0_4_4" }));
    assert_eq!(GgmlType::from_ggml_id(99), Err(FormatError::UnknownGgmlType { id: 99 }));
}

/// Every id ggml has defined, with its name and geometry as ggml.h / ggml-common.h give them
/// (the removed Q4_2 and Q4_3 as last defined), written out independently of the table.
#[test]
fn every_ggml_type_s_id_name_and_geometry() {
    #[rustfmt::skip]
    let expect: [(&str, usize, usize); 42] = [
        ("F32", 1, 4), ("F16", 1, 2), ("Q4_0", 32, 18), ("Q4_1", 32, 20), ("Q4_2", 16, 10), ("Q4_3", 16, 12),
        ("Q5_0", 32, 22), ("Q5_1", 32, 24), ("Q8_0", 32, 34), ("Q8_1", 32, 36), ("Q2_K", 256, 84), ("Q3_K", 256, 110),
        ("Q4_K", 256, 144), ("Q5_K", 256, 176), ("Q6_K", 256, 210), ("Q8_K", 256, 292), ("IQ2_XXS", 256, 66),
        ("IQ2_XS", 256, 74), ("IQ3_XXS", 256, 98), ("IQ1_S", 256, 50), ("IQ4_NL", 32, 18), ("IQ3_S", 256, 110),
        ("IQ2_S", 256, 82), ("IQ4_XS", 256, 136), ("I8", 1, 1), ("I16", 1, 2), ("I32", 1, 4), ("I64", 1, 8), ("F64", 1, 8),
        ("IQ1_M", 256, 56), ("BF16", 1, 2), ("Q4_0_4_4", 32, 18), ("Q4_0_4_8", 32, 18), ("Q4_0_8_8", 32, 18),
        ("TQ1_0", 256, 54), ("TQ2_0", 256, 66), ("IQ4_NL_4_4", 32, 18), ("IQ4_NL_4_8", 32, 18), ("IQ4_NL_8_8", 32, 18),
        ("MXFP4", 32, 17), ("NVFP4", 64, 36), ("Q1_0", 128, 18),
    ];
    assert_eq!(GgmlType::ALL.len(), expect.len());
    for (id, (name, bs, ts)) in expect.into_iter().enumerate() {
        let t = GgmlType::from_ggml_id(id as u32).unwrap();
        assert_eq!((t.id() as usize, t.name(), t.block_size(), t.type_size()), (id, name, bs, ts));
        assert_eq!(GgmlType::from_name(name), Some(t));
        assert_eq!(GgmlType::ALL[id], t);
        let removed = matches!(id, 4 | 5 | 31..=33 | 36..=38);
        assert_eq!(t.is_removed(), removed, "{name}");
    }
    assert_eq!(GgmlType::from_ggml_id(42), Err(FormatError::UnknownGgmlType { id: 42 }));
}

const ONE: [u8; 2] = [0x00, 0x3C]; // f16 1.0
const HALF: [u8; 2] = [0x00, 0x38]; // f16 0.5

#[test]
fn legacy_hand_values() {
    // Q4_0, d = 0.5, every qs byte 0x1F: low nibble 15 -> 3.5, high nibble 1 -> -3.5.
    let mut b = HALF.to_vec();
    b.extend([0x1F; 16]);
    let y = dequantize(GgmlType::Q4_0, &b, 32).unwrap();
    assert_eq!((y[0], y[15], y[16], y[31]), (3.5, 3.5, -3.5, -3.5));
    // Q4_1, d = 0.5, m = 1.0: 0.5 * 15 + 1 and 0.5 * 1 + 1.
    let mut b = [HALF, ONE].concat();
    b.extend([0x1F; 16]);
    let y = dequantize(GgmlType::Q4_1, &b, 32).unwrap();
    assert_eq!((y[0], y[16]), (8.5, 1.5));
    // Q5_0, d = 1, qh bit 0 and bit 17 set, qs = 0: element 0 -> 16 - 16 = 0, 1 -> -16, 17 -> 0.
    let mut b = ONE.to_vec();
    b.extend((1u32 | 1 << 17).to_le_bytes());
    b.extend([0u8; 16]);
    let y = dequantize(GgmlType::Q5_0, &b, 32).unwrap();
    assert_eq!((y[0], y[1], y[16], y[17]), (0.0, -16.0, -16.0, 0.0));
    // Q8_0, d = 0.5, qs = -128, 127.
    let mut b = HALF.to_vec();
    b.extend([0x80, 0x7F]);
    b.extend([0u8; 30]);
    let y = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
    assert_eq!((y[0], y[1], y[2]), (-64.0, 63.5, 0.0));
}

#[test]
fn kquant_hand_values() {
    // Q4_K, d = 1, dmin = 0.5; sub-block 0: sc = 2, mn = 3; sub-block 4: sc = 1 | 1 << 4, mn = 0.
    let mut b = [ONE, HALF].concat();
    let mut scales = [0u8; 12];
    scales[0] = 2 | 1 << 6; // sc0 = 2, high bits of sc4 = 1
    scales[4] = 3; // mn0 = 3
    scales[8] = 1; // low bits of sc4 = 1, of mn4 = 0
    b.extend(scales);
    b.extend([0x21u8; 128]); // low nibble 1, high nibble 2
    let y = dequantize(GgmlType::Q4_K, &b, 256).unwrap();
    assert_eq!(y[0], 2.0 * 1.0 - 1.5); // sub-block 0, low nibbles of qs[0..32]
    assert_eq!(y[128], 17.0 * 1.0); // sub-block 4 = low nibbles of qs[64..96]
    // Q6_K, d = 0.5, scale 0 = -2, ql = 0, qh = 0: q = -32 -> 0.5 * -2 * -32 = 32.
    let mut b = vec![0u8; 192];
    b.extend([0xFEu8; 16]);
    b.extend(HALF);
    let y = dequantize(GgmlType::Q6_K, &b, 256).unwrap();
    assert!(y.iter().all(|&v| v == 32.0));
}

#[test]
fn awq_and_gptq_hand_values() {
    // K = 32, N = 8, G = 32. AWQ column c of row k holds the value c at shift AWQ_SHIFTS[c];
    // zero points 1 everywhere; scale 0.5: w[k][c] = (c - 1) * 0.5.
    let word: u32 = (0..8u32).map(|c| c << boostr::formats::AWQ_SHIFTS[c as usize]).sum();
    assert_eq!(word, 0x7531_6420);
    let qweight: Vec<u8> = (0..32).flat_map(|_| word.to_le_bytes()).collect();
    let qzeros = 0x1111_1111u32.to_le_bytes();
    let scales: Vec<u8> = (0..8).flat_map(|_| HALF).collect();
    let awq = AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: 32, out_features: 8, group_size: 32 };
    let w = awq.dequantize().unwrap();
    assert_eq!(&w[..8], &[-0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]);
    // GPTQ: word (r, n) holds inputs 8r .. 8r + 8 at shifts 4i; 0x76543210 gives q = k % 8.
    let qweight: Vec<u8> = (0..32).flat_map(|_| 0x7654_3210u32.to_le_bytes()).collect();
    let mut gptq = GptqTensors {
        qweight: &qweight,
        qzeros: &qzeros,
        scales: &scales,
        g_idx: None,
        in_features: 32,
        out_features: 8,
        group_size: 32,
        zero_offset: GptqZeroOffset::V1PlusOne,
    };
    // v1: stored zero 1 -> effective 2: w[k][n] = (k % 8 - 2) * 0.5.
    let w = gptq.dequantize().unwrap();
    assert_eq!((w[0], w[8 * 3], w[8 * 7 + 5]), (-1.0, 0.5, 2.5));
    gptq.zero_offset = GptqZeroOffset::V2AsStored;
    let w = gptq.dequantize().unwrap();
    assert_eq!((w[0], w[8 * 3]), (-0.5, 1.0));
}
