//! The reference mat-vec and mat-mat over the packed layout.

#[path = "formats_util.rs"]
mod util;

use boostr::formats::{AwqTensors, FormatError, GgmlType, dequantize, matmul_ref, matvec_ref, repack};
use util::{Rng, random_tensor};

#[test]
fn q8_0_hand_matvec() {
    // One row of one Q8_0 block, d = 1, q[j] = j - 16; x[j] = j: Σ j (j - 16) = 10416 - 7936.
    let mut b = vec![0x00, 0x3C];
    b.extend((0..32).map(|j: i32| (j - 16) as i8 as u8));
    let p = repack(GgmlType::Q8_0, &b, 1, 32).unwrap();
    let x: Vec<f32> = (0..32).map(|j| j as f32).collect();
    assert_eq!(matvec_ref(&p, &x).unwrap(), vec![2480.0]);
    assert_eq!(matvec_ref(&p, &[1.0; 32]).unwrap(), vec![-16.0]);
}

#[test]
fn matmul_equals_dot_products_of_reference_rows() {
    let mut rng = Rng(21);
    for ty in GgmlType::SUPPORTED {
        let (rows, cols) = (5, 3 * ty.block_size().max(8));
        let data = random_tensor(&mut rng, ty, rows * cols);
        let w = dequantize(ty, &data, rows * cols).unwrap();
        let p = repack(ty, &data, rows, cols).unwrap();
        for m in [1, 3] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.f32_in(-1.0, 1.0)).collect();
            let y = matmul_ref(&p, &x, m).unwrap();
            assert_eq!(y.len(), m * rows);
            for i in 0..m {
                for r in 0..rows {
                    let want: f64 = (0..cols).map(|c| x[i * cols + c] as f64 * w[r * cols + c] as f64).sum();
                    let got = y[i * rows + r];
                    assert_eq!(got.to_bits(), (want as f32).to_bits(), "{ty} m={m} i={i} r={r}");
                }
            }
        }
    }
}

#[test]
fn matmul_checks_activation_length() {
    let p = repack(GgmlType::F32, &[0u8; 4 * 6], 2, 3).unwrap();
    let err = matmul_ref(&p, &[0.0; 5], 2).unwrap_err();
    assert_eq!(err, FormatError::Length { what: "x", expected: 6, actual: 5 });
}

#[test]
fn int4_matmul_contracts_over_inputs() {
    // AWQ K = 64, N = 16: y[i][n] = Σ_k x[i][k] * w[k][n] with w the reference [K, N].
    let mut rng = Rng(33);
    let (k, n, g) = (64, 16, 32);
    let qweight = rng.bytes(k * n / 2);
    let qzeros = rng.bytes(k / g * n / 2);
    let scales: Vec<u8> = (0..k / g * n).flat_map(|_| half::f16::from_f32(rng.f32_in(-0.1, 0.1)).to_le_bytes()).collect();
    let t = AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: k, out_features: n, group_size: g };
    let w = t.dequantize().unwrap();
    let p = t.repack().unwrap();
    let m = 2;
    let x: Vec<f32> = (0..m * k).map(|_| rng.f32_in(-1.0, 1.0)).collect();
    let y = matmul_ref(&p, &x, m).unwrap();
    for i in 0..m {
        for col in 0..n {
            let want: f64 = (0..k).map(|kk| x[i * k + kk] as f64 * w[kk * n + col] as f64).sum();
            assert_eq!(y[i * n + col], want as f32, "i={i} n={col}");
        }
    }
}
