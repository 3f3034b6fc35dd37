//! The model's weights on the GPU, uploaded once at load into boostr's repacked layouts (F32
//! projection matrices narrowed to F16, or BF16 where f16's range is too small):
//! mat-vec matrices ([`QuantMatrix`], split by rows over the binding limit), the embedding table
//! ([`GpuEmbedding`], split likewise), and f32 vectors. A [`Op::Linear`] over several matrices of
//! one format is uploaded as ONE matrix (rows concatenated: fused Q/K/V, fused gate/up); matrices
//! of different formats (K-quant mixes store V in another type than Q and K) stay separate and
//! write their columns of the packed output.

use std::collections::HashMap;
use std::sync::Arc;

use boostr::embedding::GpuEmbedding;
use boostr::formats::{GgmlType, PackedFormat, PackedWeights, repack};
use boostr::ops_common::GpuView;
use boostr::quant::QuantMatrix;
use boostr::quant::upload::concat_rows;
use numr::gpu::GpuContext;

use super::super::EngineError;
use super::super::backend::{LoadProgress, ProgressFn};
use super::super::graph::{MatRef, ModelGraph, Op};
use super::super::weights::WeightSource;
use super::dev_err;

/// One matrix of a linear op and the first output column it writes.
#[derive(Clone)]
pub(crate) struct LinearPart {
    pub(crate) w: Arc<QuantMatrix>,
    pub(crate) col0: usize,
}

/// Every weight of the graph, on the GPU.
pub(crate) struct GpuWeights {
    /// Per op index: the parts of a `Linear` or `LmHead`.
    pub(crate) linear: HashMap<usize, Vec<LinearPart>>,
    /// Per op index: the table of an `Embed`.
    pub(crate) embed: HashMap<usize, Arc<GpuEmbedding>>,
    /// Vectors (and LFM2's f32 conv taps) by tensor name.
    pub(crate) vecs: HashMap<String, GpuView>,
    /// The host copies of vectors (RoPE frequency factors are folded into frequencies).
    pub(crate) host_vecs: HashMap<String, Vec<f32>>,
    /// Bytes uploaded.
    pub(crate) bytes: u64,
}

/// Total bytes the upload reads from the file (for progress).
fn total_bytes(graph: &ModelGraph, src: &dyn WeightSource) -> Result<u64, EngineError> {
    let mut t = 0u64;
    for op in &graph.ops {
        for m in op.mats() {
            t += src.stored(m)?.bytes;
        }
        for v in op.vecs() {
            t += 4 * v.len as u64;
        }
    }
    Ok(t)
}

/// The embedding kernel gathers these formats; other tables are widened to f32 on the host.
fn embeddable(p: &PackedWeights) -> bool {
    use GgmlType::*;
    matches!(p.format(), PackedFormat::Ggml(F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0))
}

fn widen_to_f32(p: &PackedWeights) -> Result<PackedWeights, EngineError> {
    let v = p.dequantize();
    repack(GgmlType::F32, bytemuck::cast_slice(&v), p.rows(), p.cols()).map_err(|e| EngineError::Unsupported { what: format!("embedding table: {e}") })
}

impl GpuWeights {
    pub(crate) fn upload(ctx: &GpuContext, graph: &ModelGraph, src: &dyn WeightSource, progress: Option<ProgressFn<'_>>) -> Result<GpuWeights, EngineError> {
        let total = total_bytes(graph, src)?;
        let mut done = 0u64;
        let mut tick = |n: u64| {
            done += n;
            if let Some(p) = progress {
                p(LoadProgress { done, total });
            }
        };
        let mut w = GpuWeights { linear: HashMap::new(), embed: HashMap::new(), vecs: HashMap::new(), host_vecs: HashMap::new(), bytes: 0 };
        // The tied LM head and the embedding share one host repack.
        let mut packed_cache: HashMap<String, Arc<PackedWeights>> = HashMap::new();
        let mut packed = |m: &MatRef, tick: &mut dyn FnMut(u64)| -> Result<Arc<PackedWeights>, EngineError> {
            if let Some(p) = packed_cache.get(&m.name) {
                return Ok(p.clone());
            }
            let p = Arc::new(src.packed(m)?);
            tick(src.stored(m)?.bytes);
            packed_cache.insert(m.name.clone(), p.clone());
            Ok(p)
        };
        for (i, op) in graph.ops.iter().enumerate() {
            match op {
                Op::Embed { table, .. } => {
                    let p = packed(table, &mut tick)?;
                    let t = if embeddable(&p) { GpuEmbedding::new(ctx, &p, None) } else { GpuEmbedding::new(ctx, &widen_to_f32(&p)?, None) };
                    let t = t.map_err(|e| EngineError::Unsupported { what: format!("tensor {}: {e}", table.name) })?;
                    w.bytes += p.total_bytes() as u64;
                    w.embed.insert(i, Arc::new(t));
                }
                Op::Linear { .. } | Op::LmHead { .. } => {
                    let mats = op.mats();
                    let ps = mats.iter().map(|m| packed(m, &mut tick).and_then(narrow_f32)).collect::<Result<Vec<_>, _>>()?;
                    let same = ps.windows(2).all(|p| p[0].format() == p[1].format());
                    let mut parts = Vec::new();
                    if same && ps.len() > 1 {
                        let refs: Vec<&PackedWeights> = ps.iter().map(|p| p.as_ref()).collect();
                        let cat = concat_rows(&refs).map_err(|e| EngineError::Unsupported { what: format!("fusing {}: {e}", names(&mats)) })?;
                        parts.push(LinearPart { w: Arc::new(upload_mat(ctx, &names(&mats), &cat)?), col0: 0 });
                        w.bytes += cat.total_bytes() as u64;
                    } else {
                        let mut col0 = 0;
                        for (m, p) in mats.iter().zip(&ps) {
                            parts.push(LinearPart { w: Arc::new(upload_mat(ctx, &m.name, p)?), col0 });
                            w.bytes += p.total_bytes() as u64;
                            col0 += m.rows;
                        }
                    }
                    w.linear.insert(i, parts);
                }
                // The conv taps as f32, stored by name like the vectors.
                Op::ShortConv { w: m, .. } if !w.vecs.contains_key(&m.name) => {
                    let host = src.mat_f32(m)?;
                    let buf = ctx.upload(bytemuck::cast_slice(&host)).map_err(|e| dev_err(ctx, e))?;
                    tick(src.stored(m)?.bytes);
                    w.bytes += 4 * host.len() as u64;
                    w.vecs.insert(m.name.clone(), GpuView::whole(&buf));
                }
                _ => {}
            }
            for v in op.vecs() {
                if w.vecs.contains_key(&v.name) {
                    continue;
                }
                let host = src.vec(v)?;
                let buf = ctx.upload(bytemuck::cast_slice(&host)).map_err(|e| dev_err(ctx, e))?;
                tick(4 * v.len as u64);
                w.bytes += 4 * v.len as u64;
                w.vecs.insert(v.name.clone(), GpuView::whole(&buf));
                w.host_vecs.insert(v.name.clone(), host);
            }
        }
        Ok(w)
    }
}

impl GpuWeights {
    /// The vector (or LFM2 conv taps) `name` on the GPU; [`EngineError::MissingTensor`] when it
    /// was not uploaded.
    pub(crate) fn vec(&self, name: &str) -> Result<&GpuView, EngineError> {
        self.vecs.get(name).ok_or_else(|| EngineError::MissingTensor { name: name.to_string() })
    }

    /// The host copy of the vector `name`; [`EngineError::MissingTensor`] when it was not
    /// uploaded.
    pub(crate) fn host_vec(&self, name: &str) -> Result<&[f32], EngineError> {
        self.host_vecs.get(name).map(Vec::as_slice).ok_or_else(|| EngineError::MissingTensor { name: name.to_string() })
    }

    /// The parts (at least one) of `graph`'s linear op `op`; [`EngineError::MissingTensor`]
    /// naming its matrices when they were not uploaded.
    pub(crate) fn linear_parts(&self, graph: &ModelGraph, op: usize) -> Result<&[LinearPart], EngineError> {
        match self.linear.get(&op) {
            Some(p) if !p.is_empty() => Ok(p),
            _ => Err(missing_op(graph, op)),
        }
    }

    /// The table of `graph`'s embedding op `op`; [`EngineError::MissingTensor`] naming it when it
    /// was not uploaded.
    pub(crate) fn embedding(&self, graph: &ModelGraph, op: usize) -> Result<&Arc<GpuEmbedding>, EngineError> {
        self.embed.get(&op).ok_or_else(|| missing_op(graph, op))
    }
}

/// The missing matrices of op `op`.
fn missing_op(graph: &ModelGraph, op: usize) -> EngineError {
    let name = graph.ops.get(op).map_or_else(|| format!("(the weights of op {op})"), |o| names(&o.mats()));
    EngineError::MissingTensor { name }
}

/// An F32 matrix as F16 (BF16 when a value is beyond f16's range): the GPU's F16/BF16 GEMV and
/// GEMM read half the bytes. Other formats unchanged.
fn narrow_f32(p: Arc<PackedWeights>) -> Result<Arc<PackedWeights>, EngineError> {
    if p.format() != PackedFormat::Ggml(GgmlType::F32) {
        return Ok(p);
    }
    let v = p.dequantize();
    let (ty, bytes): (GgmlType, Vec<u16>) = if v.iter().all(|x| x.abs() <= 65504.0) {
        (GgmlType::F16, v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect())
    } else {
        (GgmlType::BF16, v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect())
    };
    let narrowed = repack(ty, bytemuck::cast_slice(&bytes), p.rows(), p.cols())
        .map_err(|e| EngineError::Unsupported { what: format!("an F32 matrix as {}: {e}", ty.name()) })?;
    Ok(Arc::new(narrowed))
}

fn names(mats: &[&MatRef]) -> String {
    mats.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(" + ")
}

fn upload_mat(ctx: &GpuContext, name: &str, p: &PackedWeights) -> Result<QuantMatrix, EngineError> {
    QuantMatrix::upload(ctx, name, p).map_err(|e| match e {
        boostr::quant::QuantError::Gpu(g) => dev_err(ctx, g),
        e => EngineError::Unsupported { what: format!("tensor {name}: {e}") },
    })
}
