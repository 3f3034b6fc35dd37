//! A tensor missing from the GPU upload is a typed [`EngineError::MissingTensor`] naming it when
//! a sequence's plans are built (never a panic), on both decode paths, for every kind of weight
//! the plan builder looks up: a norm weight, a Q/K/V, O or FFN matrix, the embedding table.

use std::collections::HashMap;
use std::sync::Arc;

use boostr::formats::GgmlType;

use super::GpuBackend;
use crate::engine::EngineError;
use crate::engine::arch::{FileFacts, build};
use crate::engine::backend::{Backend, KvType, StateOpts};
use crate::engine::config::ModelConfig;
use crate::engine::graph::{ModelGraph, Op, VecRef};
use crate::engine::options::DecodeGemv;
use crate::engine::weights::WeightSource;
use crate::gguf::{HyperParams, PerLayer};
use crate::model_file::{ModelError, TensorDType, TensorMeta, TensorSource};

/// Q8_0 matrices of small made-up values, vectors of ones.
struct Synth(HashMap<String, (usize, usize, Vec<u8>)>);

impl Synth {
    fn new(g: &ModelGraph) -> Synth {
        let mut mats = HashMap::new();
        for op in &g.ops {
            for m in op.mats() {
                let blocks = m.rows * m.cols / 32;
                let mut b = Vec::with_capacity(blocks * 34);
                for i in 0..blocks {
                    b.extend_from_slice(&half::f16::from_f32(1.0 / 64.0).to_bits().to_le_bytes());
                    b.extend((0..32).map(|j| ((i * 7 + j * 13) % 31) as u8 ^ 0x80));
                }
                mats.insert(m.name.clone(), (m.rows, m.cols, b));
            }
        }
        Synth(mats)
    }
}

/// The matrices as Q8_0 tensors of ggml dims `[cols, rows]`; the vectors come from
/// [`WeightSource::vec`] below.
impl TensorSource for Synth {
    fn tensor_names(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
    fn tensor_meta(&self, name: &str) -> Option<TensorMeta> {
        let (rows, cols, bytes) = self.0.get(name)?;
        let (name, dtype) = (name.to_string(), TensorDType::Ggml(GgmlType::Q8_0));
        Some(TensorMeta { file_name: name.clone(), name, dtype, dims: vec![*cols as u64, *rows as u64], n_bytes: bytes.len() as u64 })
    }
    fn tensor_data(&self, name: &str) -> Result<&[u8], ModelError> {
        self.0.get(name).map(|(_, _, b)| b.as_slice()).ok_or_else(|| ModelError::Missing(name.to_string()))
    }
}

impl WeightSource for Synth {
    fn vec(&self, v: &VecRef) -> Result<Vec<f32>, EngineError> {
        Ok(vec![1.0; v.len])
    }
}

fn llama() -> ModelGraph {
    // Heads of 64 (the GPU's decode attention takes 64, 128 or 256), grouped two to one.
    let mut hp = HyperParams::new("llama".into(), 128, 2, 2);
    hp.head_count_kv = PerLayer::Uniform(1);
    hp.feed_forward_length = Some(PerLayer::Uniform(128));
    build(&ModelConfig::from_hparams(&hp, Some(96)).unwrap(), &FileFacts::default())
}

/// Takes a tensor (by name, or its op's index) out of the upload.
type Remove = fn(&mut super::weights::GpuWeights, usize, &str);

#[test]
fn a_tensor_missing_from_the_upload_is_a_typed_error() {
    let Some(ctx) = numr::testing::test_gpu() else { return };
    let ctx = Arc::new(ctx);
    let g = llama();
    let src = Synth::new(&g);
    let opts = StateOpts { n_ctx: 32, ubatch: 8, kv: KvType::F16 };
    let op_of = |name: &str| g.ops.iter().position(|o| o.mats().iter().any(|m| m.name == name)).unwrap();
    for gemv in [DecodeGemv::F32, DecodeGemv::Int8] {
        let whole = GpuBackend::load(ctx.clone(), &g, &src, None).unwrap().with_decode_gemv(gemv);
        whole.new_state(&opts).unwrap_or_else(|e| panic!("{gemv:?}: the whole upload builds: {e}"));
        let removals: [(&str, Remove); 6] = [
            ("blk.0.attn_norm.weight", |w, _, n| drop(w.vecs.remove(n))),
            ("blk.1.ffn_norm.weight", |w, _, n| drop(w.vecs.remove(n))),
            ("output_norm.weight", |w, _, n| drop(w.vecs.remove(n))),
            ("blk.0.attn_output.weight", |w, op, _| drop(w.linear.remove(&op))),
            ("blk.1.ffn_down.weight", |w, op, _| drop(w.linear.remove(&op))),
            ("token_embd.weight", |w, _, _| w.embed.clear()),
        ];
        for (name, remove) in removals {
            let mut b = GpuBackend::load(ctx.clone(), &g, &src, None).unwrap().with_decode_gemv(gemv);
            let op = if name.ends_with("norm.weight") { 0 } else { op_of(name) };
            remove(Arc::get_mut(&mut b.weights).unwrap(), op, name);
            match b.new_state(&opts) {
                Err(EngineError::MissingTensor { name: got }) => assert_eq!(got, name, "{gemv:?}"),
                Err(e) => panic!("{gemv:?} without {name}: {e}"),
                Ok(_) => panic!("{gemv:?} without {name}: built"),
            }
        }
        // The fused Q/K/V names its three matrices.
        let mut b = GpuBackend::load(ctx.clone(), &g, &src, None).unwrap().with_decode_gemv(gemv);
        let qkv = g.ops.iter().position(|o| matches!(o, Op::Linear { ws, .. } if ws.len() == 3)).unwrap();
        Arc::get_mut(&mut b.weights).unwrap().linear.remove(&qkv);
        match b.new_state(&opts) {
            Err(EngineError::MissingTensor { name }) => assert_eq!(name, "blk.0.attn_q.weight + blk.0.attn_k.weight + blk.0.attn_v.weight", "{gemv:?}"),
            Err(e) => panic!("{gemv:?} without Q/K/V: {e}"),
            Ok(_) => panic!("{gemv:?} without Q/K/V: built"),
        }
    }
}
