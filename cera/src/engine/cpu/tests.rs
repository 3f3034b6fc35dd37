//! The whole executor on a small synthetic Gemma-3-shaped model (every feature on: QK-norm,
//! NeoX RoPE, a sliding window shorter than the prompt, both soft-caps, GQA, quantized weights
//! of several formats): the AVX2 inner loops against the portable ones, and chunked prefill
//! against token-by-token steps, for both cache types.

use std::collections::HashMap;

use boostr::formats::GgmlType;

use super::CpuBackend;
use super::kernels::Kernels;
use crate::engine::arch::{FileFacts, build};
use crate::engine::backend::{Backend, KvType, StateOpts, StepInput, StepOutput, Want};
use crate::engine::config::ModelConfig;
use crate::engine::graph::ModelGraph;
use crate::engine::weights::WeightSource;
use crate::gguf::HyperParams;
use crate::model_file::{ModelError, TensorDType, TensorMeta, TensorSource};

/// Weights made up from a seed, each matrix in a chosen format with sane block scales, each
/// vector in f32: `(type, ggml dims, bytes)` by name.
struct Synth {
    tensors: HashMap<String, (GgmlType, Vec<u64>, Vec<u8>)>,
}

fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// f16 bits of `2^-e`.
fn pow2(e: u16) -> [u8; 2] {
    ((15 - e) << 10).to_le_bytes()
}

/// `rows x cols` of `ty` with the block scales set to small powers of two.
fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut b = noise(ty.bytes_for(rows * cols).unwrap(), seed);
    for blk in b.chunks_mut(ty.type_size()) {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 => blk[..2].copy_from_slice(&pow2(6)),
            GgmlType::Q5_1 => {
                blk[..2].copy_from_slice(&pow2(6));
                blk[2..4].copy_from_slice(&((11u16 << 10) | 0x8000).to_le_bytes()); // m = -2^-4
            }
            GgmlType::Q4_K => {
                blk[..2].copy_from_slice(&pow2(8));
                blk[2..4].copy_from_slice(&pow2(9));
            }
            GgmlType::Q6_K => blk[208..210].copy_from_slice(&pow2(11)),
            _ => unreachable!(),
        }
    }
    b
}

impl Synth {
    fn new(g: &ModelGraph) -> Synth {
        let mut tensors = HashMap::new();
        for (i, op) in g.ops.iter().enumerate() {
            for (j, m) in op.mats().into_iter().enumerate() {
                let ty = match (m.cols % 256, (i + j) % 4) {
                    (0, 0) => GgmlType::Q4_K,
                    (0, 1) => GgmlType::Q6_K,
                    (_, 0 | 1) => GgmlType::Q8_0,
                    (_, 2) => GgmlType::Q4_0,
                    _ => GgmlType::Q5_1,
                };
                let dims = vec![m.cols as u64, m.rows as u64];
                tensors.entry(m.name.clone()).or_insert_with(|| (ty, dims, matrix(ty, m.rows, m.cols, (7 * i + j) as u64)));
            }
            for v in op.vecs() {
                let x = noise(v.len, i as u64 + 99).into_iter().flat_map(|b| (0.5 + b as f32 / 255.0).to_le_bytes()).collect();
                tensors.insert(v.name.clone(), (GgmlType::F32, vec![v.len as u64], x));
            }
        }
        Synth { tensors }
    }
}

impl TensorSource for Synth {
    fn tensor_names(&self) -> Vec<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }
    fn tensor_meta(&self, name: &str) -> Option<TensorMeta> {
        let (ty, dims, bytes) = self.tensors.get(name)?;
        Some(TensorMeta { name: name.into(), file_name: name.into(), dtype: TensorDType::Ggml(*ty), dims: dims.clone(), n_bytes: bytes.len() as u64 })
    }
    fn tensor_data(&self, name: &str) -> Result<&[u8], ModelError> {
        self.tensors.get(name).map(|t| &t.2[..]).ok_or_else(|| ModelError::Missing(format!("tensor {name}")))
    }
}

impl WeightSource for Synth {}

fn graph() -> ModelGraph {
    let mut hp = HyperParams::new("gemma3".into(), 64, 3, 4);
    hp.head_count_kv = crate::gguf::PerLayer::Uniform(2);
    hp.key_length = 32;
    hp.value_length = 32;
    hp.feed_forward_length = Some(crate::gguf::PerLayer::Uniform(256));
    hp.sliding_window = Some(5);
    hp.attn_logit_softcapping = Some(30.0);
    hp.final_logit_softcapping = Some(20.0);
    let mut cfg = ModelConfig::from_hparams(&hp, Some(97)).unwrap();
    cfg.window[2] = None;
    build(&cfg, &FileFacts::default())
}

fn run(b: &CpuBackend, prompt: &[u32], ubatch: usize, kv: KvType) -> Vec<Vec<f32>> {
    let mut s = b.new_state(&StateOpts { n_ctx: 32, ubatch, kv }).unwrap();
    let mut out = Vec::new();
    for (i, chunk) in prompt.chunks(ubatch).enumerate() {
        match s.step(StepInput::Tokens(chunk), i * ubatch, Want::Logits).unwrap() {
            StepOutput::Logits(l) => out.push(l),
            other => panic!("{other:?}"),
        }
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn vector_and_portable_kernels_and_chunking_agree() {
    let g = graph();
    let src = Synth::new(&g);
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 % 97) as u32).collect();
    let fast = CpuBackend::load(&g, &src, 2, None).unwrap();
    let plain = CpuBackend::load_with(&g, &src, 1, None, Kernels::Portable, false).unwrap();
    for kv in [KvType::F16, KvType::Q8_0] {
        let whole = run(&fast, &prompt, 12, kv).pop().unwrap();
        assert!(whole.iter().all(|v| v.is_finite() && v.abs() <= 20.0), "soft-capped logits: {whole:?}");
        assert!(max_diff(&whole, &whole[1..]) > 1e-3, "logits that differ across the vocabulary");
        let portable = run(&plain, &prompt, 12, kv).pop().unwrap();
        assert!(max_diff(&whole, &portable) < 1e-4, "{kv:?}: AVX2 vs portable {}", max_diff(&whole, &portable));
        for ub in [5, 1] {
            let chunked = run(&fast, &prompt, ub, kv).pop().unwrap();
            assert!(max_diff(&whole, &chunked) < 1e-4, "{kv:?} ubatch {ub}: {}", max_diff(&whole, &chunked));
        }
        let steps = run(&plain, &prompt, 1, kv);
        assert!(max_diff(&whole, &steps[11]) < 1e-4, "{kv:?}: portable token by token");
        // The window (5) is shorter than the prompt: the logits after token 11 differ from a run
        // with a window longer than the prompt.
        let mut wide = g.clone();
        wide.cfg.window = vec![Some(64); 3];
        wide.ops.iter_mut().for_each(|op| {
            if let crate::engine::graph::Op::Attention { window, .. } = op
                && window.is_some()
            {
                *window = Some(64);
            }
        });
        let wide = run(&CpuBackend::load(&wide, &src, 1, None).unwrap(), &prompt, 12, kv).pop().unwrap();
        assert!(max_diff(&whole, &wide) > 1e-3, "{kv:?}: the sliding window masks something");
    }
}
