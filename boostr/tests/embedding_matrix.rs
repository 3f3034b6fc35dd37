//! The embedding gather from a [`QuantMatrix`] (`MatrixGather`): every format the matrix kernels
//! decode, K-quants included, against the packed table's CPU decoder; a table split into parts;
//! a matrix shared with a matrix kernel's caller (`GpuEmbedding::from_matrix`); the plan over GPU
//! ids at step offsets, with out-of-range ids as zero rows.
//!
//! Tolerance: the gather computes `a * q + b` per element (the decoders' affine form), the CPU
//! decoder each format's own expression. For the legacy formats and the floats both are exact
//! (bit for bit, asserted); the K-quants' scales are combined in another order, so they differ
//! by f32 rounding: 1e-5 relative to the larger of |want| and rms(want).

#[path = "formats_util.rs"]
mod util;

use std::sync::Arc;

use boostr::embedding::{EmbeddingPlan, GpuEmbedding, embedding_ref, embedding_ref_lenient};
use boostr::formats::{GgmlType, PackedWeights};
use boostr::ops_common::{GpuView, OpPlan, OpsError, tensor_view};
use boostr::quant::QuantMatrix;
use numr::gpu::StepValues;
use numr::testing::{check_close_rtol, test_gpu};
use numr::{DType, Device, Tensor};
use util::{Rng, random_ggml};

const VOCAB: usize = 37;
const COLS: usize = 256;
const RTOL: f64 = 1e-5;
/// Formats whose gathered values equal the CPU decoder's bit for bit.
const EXACT: [GgmlType; 8] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn close(got: &[f32], want: &[f32], what: &str) {
    check_close_rtol(&f64s(got), &f64s(want), RTOL).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// A byte limit that splits the table into parts of about five rows.
fn five_rows(table: &PackedWeights) -> u64 {
    5 * table.bytes_per_row_read() as u64 + 64
}

fn table(ty: GgmlType, seed: u64) -> PackedWeights {
    random_ggml(&mut Rng(seed), ty, VOCAB, COLS)
}

#[test]
fn every_matrix_format_gathers_what_the_cpu_decodes() {
    let Some(ctx) = test_gpu() else { return };
    let ids = [0u32, 36, 5, 5, 17, 9, 30];
    for (i, &ty) in GgmlType::SUPPORTED.iter().enumerate() {
        let t = table(ty, 10 + i as u64);
        let want = embedding_ref(&t, &ids, 1.5).unwrap();
        let emb = GpuEmbedding::new(&ctx, &t, Some(five_rows(&t))).unwrap();
        assert!(emb.n_chunks() > 1, "{ty:?}: the test exercises a split table");
        let got = emb.embed(&ctx, &ids, 1.5).unwrap().to_vec::<f32>().unwrap();
        close(&got, &want, &format!("{ty:?} through new"));
        if EXACT.contains(&ty) {
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?}: the CPU decoder's values bit for bit");
        }
        // Any format through a matrix that another kernel also reads (a tied LM head).
        let w = Arc::new(QuantMatrix::upload_with_limit(&ctx, "tied", &t, five_rows(&t)).unwrap());
        assert!(w.parts.len() > 1);
        let shared = GpuEmbedding::from_matrix(w.clone()).unwrap();
        assert!(Arc::ptr_eq(shared.matrix(), &w));
        assert_eq!((shared.vocab(), shared.cols(), shared.n_chunks()), (VOCAB, COLS, w.parts.len()));
        close(&shared.embed(&ctx, &ids, 1.5).unwrap().to_vec::<f32>().unwrap(), &want, &format!("{ty:?} from a matrix"));
        assert!(matches!(shared.embed(&ctx, &[3, 37], 1.0), Err(OpsError::TokenOutOfRange { id: 37, vocab: 37 })));
    }
}

#[test]
fn the_matrix_gather_plan_follows_the_step_and_zeroes_bad_ids() {
    let Some(ctx) = test_gpu() else { return };
    let max_tok = 4;
    for ty in [GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q2_K] {
        let t = table(ty, 3);
        let emb = GpuEmbedding::new(&ctx, &t, Some(five_rows(&t))).unwrap();
        assert!(emb.n_chunks() > 1);
        // 40 is out of range: its row becomes zeros (in row 0 of the third step, which the first
        // step filled).
        let ids = [36u32, 5, 0, 40, 17, 9, 30];
        let idb = ctx.upload(bytemuck::cast_slice(&ids)).unwrap();
        let out = Tensor::zeros(&[max_tok, COLS], DType::F32, &Device::Gpu(ctx.clone())).unwrap();
        let plan = EmbeddingPlan::new(&ctx, &emb, &GpuView::whole(&idb), max_tok, 0.5, Some(tensor_view("test", "out", &out, DType::F32).unwrap())).unwrap();
        for (tok, n) in [(0u32, 1u32), (1, 3), (3, 4), (2, 2)] {
            let step = StepValues::chunk(tok, n).with_token(tok);
            plan.run(&ctx, &step).unwrap();
            let want = embedding_ref_lenient(&t, &ids[tok as usize..(tok + n) as usize], 0.5).unwrap();
            let got = out.to_vec::<f32>().unwrap();
            close(&got[..n as usize * COLS], &want, &format!("{ty:?}, step {tok}+{n}"));
        }
        assert!(plan.check(&StepValues::chunk(0, 5)).is_err(), "a step past max_tok");
        assert!(plan.check(&StepValues::chunk(5, 4).with_token(5)).is_err(), "slots past the id buffer");
    }
}

#[test]
fn a_matrix_that_does_not_validate_is_refused() {
    let Some(ctx) = test_gpu() else { return };
    let t = table(GgmlType::Q4_K, 1);
    let mut w = QuantMatrix::upload(&ctx, "bad", &t).unwrap();
    w.rows += 1;
    assert!(GpuEmbedding::from_matrix(Arc::new(w)).is_err());
}
