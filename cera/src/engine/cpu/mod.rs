//! The CPU executor of the model graph: it interprets [`ModelGraph::ops`] in order with boostr's
//! CPU references (norms, RoPE, activations, the embedding gather, the KV-cache rounding) and
//! its own threaded quantized mat-mul and attention.
//!
//! - Weights stay in boostr's packed (quantized) layout ([`PackedWeights`]; Gemma 3's 262k x 640
//!   Q8_0 embedding is 170 MB, as f32 it would be 670 MB); a mat-mul decodes each weight row once
//!   per step and applies it to every token of the step (`matmul.rs`). Tensors named twice (a
//!   tied embedding and LM head) are held once. Norm weights are f32.
//! - Threads (`pool.rs`) split each mat-mul by output rows and attention by (token, head).
//! - The inner loops use AVX2/FMA/F16C where the CPU has them, else portable Rust (`kernels.rs`).
//! - With int8 activations (the engine's default, [`super::DecodeGemv::int8_on_cpu`]), the
//!   projections in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K quantize their input rows to int8 per block
//!   of 32 and run integer dot products (`int8.rs`, `x86_int8.rs`), as llama.cpp's CPU path
//!   does; [`CpuBackend::load`] and `--decode-gemv f32` keep f32 activations (the exact path).
//! - The state (`state.rs`) holds the KV cache, `[kv_head][n_ctx][head_dim]` per attention
//!   layer, and LFM2's conv rings (boostr's position-indexed layout), with the
//!   values each element reads back as from the GPU cache of the chosen [`KvType`]
//!   (f16 rounding, or q8_0 blocks of 32 quantized as llama.cpp does), stored as f32: the
//!   numerics of the cache type, not its memory saving.
//!
//! [`KvType`]: super::KvType

mod attention;
mod batch;
mod int8;
mod kernels;
mod matmul;
mod ops;
mod pool;
mod state;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_int8;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use boostr::act::ActKind;
use boostr::formats::PackedWeights;
use boostr::rope::{RopeParams, RopeScaling, RopeStyle};

use super::EngineError;
use super::backend::{Backend, BackendState, LoadProgress, ProgressFn, StateOpts};
use super::config::{GateAct, ModelConfig};
use super::graph::{MatRef, ModelGraph, Op, Slot, VecRef};
use super::weights::WeightSource;
use kernels::Kernels;
use matmul::MatGroup;
use pool::Pool;

/// An op with its weights resolved.
enum CpuOp {
    Embed { table: Arc<PackedWeights>, scale: f32 },
    Norm { x: Slot, w: Vec<f32>, out: Slot },
    AddNorm { x: Slot, w: Vec<f32>, out: Slot },
    Linear { g: Arc<MatGroup>, x: Slot, out: Slot },
    QkvRope { layer: usize, qk_norm: Option<(Vec<f32>, Vec<f32>)>, rope: RopeParams, freqs: Vec<f32> },
    Attention { layer: usize, window: Option<usize> },
    Glu { act: ActKind, x: Slot, out: Slot },
    Bias { x: Slot, b: Vec<f32> },
    ShortConv { state: usize, conv: boostr::conv::ShortConv, w: Vec<f32> },
    LmHead { g: Arc<MatGroup>, softcap: Option<f32> },
}

/// What every state of one loaded model shares.
struct Model {
    cfg: ModelConfig,
    /// Slot widths, by [`state::slot_index`].
    widths: Vec<usize>,
    ops: Vec<CpuOp>,
    kernels: Kernels,
    /// Quantized projections take int8 activations and integer dots (`int8.rs`).
    int8: bool,
    /// One step at a time uses the threads.
    pool: Mutex<Pool>,
    threads: usize,
}

/// The model prepared for the CPU.
pub struct CpuBackend {
    model: Arc<Model>,
}

fn bad(reason: String) -> EngineError {
    EngineError::BadConfig { reason }
}

/// Loads matrices and vectors by name, each once, reporting bytes prepared.
struct Loader<'a> {
    src: &'a dyn WeightSource,
    mats: HashMap<String, Arc<PackedWeights>>,
    done: u64,
    total: u64,
    progress: Option<ProgressFn<'a>>,
}

impl Loader<'_> {
    fn report(&mut self, bytes: u64) {
        self.done += bytes;
        if let Some(p) = self.progress {
            p(LoadProgress { done: self.done, total: self.total });
        }
    }

    fn mat(&mut self, m: &MatRef) -> Result<Arc<PackedWeights>, EngineError> {
        if let Some(p) = self.mats.get(&m.name) {
            return Ok(p.clone());
        }
        let p = Arc::new(self.src.packed(m)?);
        self.mats.insert(m.name.clone(), p.clone());
        self.report(self.src.stored(m)?.bytes);
        Ok(p)
    }

    fn group(&mut self, ws: &[MatRef], x_width: usize, out_width: usize, what: &str) -> Result<Arc<MatGroup>, EngineError> {
        let parts = ws.iter().map(|m| self.mat(m)).collect::<Result<Vec<_>, _>>()?;
        let g = MatGroup::new(parts);
        if ws.is_empty() || ws.iter().any(|m| m.cols != x_width) || g.cols() != x_width || g.rows() != out_width {
            let names: Vec<&str> = ws.iter().map(|m| m.name.as_str()).collect();
            return Err(bad(format!("{what} {names:?}: {} x {} for an input of {x_width} and an output of {out_width}", g.rows(), g.cols())));
        }
        Ok(Arc::new(g))
    }

    fn mat_f32(&mut self, m: &MatRef) -> Result<Vec<f32>, EngineError> {
        let x = self.src.mat_f32(m)?;
        self.report(self.src.stored(m)?.bytes);
        Ok(x)
    }

    fn vec(&mut self, v: &VecRef, len: usize) -> Result<Vec<f32>, EngineError> {
        if v.len != len {
            return Err(bad(format!("{} has {} values where {len} are needed", v.name, v.len)));
        }
        let x = self.src.vec(v)?;
        self.report(4 * x.len() as u64);
        Ok(x)
    }
}

/// The bytes the graph's weights occupy in the source, each tensor once.
fn total_bytes(graph: &ModelGraph, src: &dyn WeightSource) -> Result<u64, EngineError> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    for op in &graph.ops {
        for m in op.mats() {
            if seen.insert(m.name.clone()) {
                total += src.stored(m)?.bytes;
            }
        }
        for v in op.vecs() {
            total += 4 * v.len as u64;
        }
    }
    Ok(total)
}

impl CpuBackend {
    /// Prepares every weight the graph names; `threads` workers (at least 1) split each mat-mul
    /// by rows. `progress` is told the source bytes prepared so far. The mat-muls keep f32
    /// activations (the exact path); [`CpuBackend::load_with_activations`] chooses.
    pub fn load(graph: &ModelGraph, src: &dyn WeightSource, threads: usize, progress: Option<ProgressFn<'_>>) -> Result<CpuBackend, EngineError> {
        CpuBackend::load_with(graph, src, threads, progress, Kernels::detect(), false)
    }

    /// [`CpuBackend::load`] with the projections' activations: with `int8`, the quantized
    /// projections (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) quantize their input rows to int8 per block of
    /// 32 and run integer dot products (llama.cpp's CPU scheme; AVX2 CPUs, else f32).
    pub fn load_with_activations(
        graph: &ModelGraph,
        src: &dyn WeightSource,
        threads: usize,
        int8: bool,
        progress: Option<ProgressFn<'_>>,
    ) -> Result<CpuBackend, EngineError> {
        CpuBackend::load_with(graph, src, threads, progress, Kernels::detect(), int8)
    }

    /// [`CpuBackend::load`] with the given inner loops.
    fn load_with(
        graph: &ModelGraph,
        src: &dyn WeightSource,
        threads: usize,
        progress: Option<ProgressFn<'_>>,
        kernels: Kernels,
        int8: bool,
    ) -> Result<CpuBackend, EngineError> {
        let c = &graph.cfg;
        let total = total_bytes(graph, src)?;
        let mut ld = Loader { src, mats: HashMap::new(), done: 0, total, progress };
        let w = |s: Slot| graph.width(s);
        let hd = c.head_dim;
        let mut ops = Vec::with_capacity(graph.ops.len());
        for op in &graph.ops {
            ops.push(match op {
                Op::Embed { table, scale } => {
                    let t = ld.mat(table)?;
                    if t.cols() != c.dim || t.rows() != c.vocab {
                        return Err(bad(format!("embedding {} is {} x {}, expected {} x {}", table.name, t.rows(), t.cols(), c.vocab, c.dim)));
                    }
                    CpuOp::Embed { table: t, scale: *scale }
                }
                Op::Norm { x, w: wv, out } => CpuOp::Norm { x: *x, w: ld.vec(wv, w(*x))?, out: *out },
                Op::AddNorm { x, w: wv, out } => CpuOp::AddNorm { x: *x, w: ld.vec(wv, c.dim)?, out: *out },
                Op::Linear { ws, x, out } => CpuOp::Linear { g: ld.group(ws, w(*x), w(*out), "linear")?, x: *x, out: *out },
                Op::QkvRope { layer, qk_norm, rope, neox, freq_factors } => {
                    let qk_norm = match qk_norm {
                        Some((q, k)) => Some((ld.vec(q, hd)?, ld.vec(k, hd)?)),
                        None => None,
                    };
                    let scaling = if rope.linear_factor != 1.0 { RopeScaling::Linear { factor: rope.linear_factor } } else { RopeScaling::None };
                    let style = if *neox { RopeStyle::Neox } else { RopeStyle::Normal };
                    let params = RopeParams { head_dim: hd, rot_dim: c.rope_dim, base: rope.base, scaling, style };
                    let mut freqs = params.inv_freqs();
                    if let Some(f) = freq_factors {
                        let f = ld.vec(f, c.rope_dim / 2)?;
                        freqs.iter_mut().zip(&f).for_each(|(v, d)| *v /= d);
                    }
                    CpuOp::QkvRope { layer: *layer, qk_norm, rope: params, freqs }
                }
                Op::Attention { layer, window } => CpuOp::Attention { layer: *layer, window: *window },
                Op::Glu { act, x, out } => {
                    let act = match act {
                        GateAct::Silu => ActKind::Silu,
                        GateAct::GeluTanh => ActKind::GeluTanh,
                    };
                    if w(*x) != 2 * w(*out) {
                        return Err(bad(format!("GLU from {x:?} ({}) into {out:?} ({})", w(*x), w(*out))));
                    }
                    CpuOp::Glu { act, x: *x, out: *out }
                }
                Op::Bias { x, bs } => {
                    let mut b = Vec::new();
                    for v in bs {
                        b.extend(ld.vec(v, v.len)?);
                    }
                    if b.len() != w(*x) {
                        return Err(bad(format!("a bias of {} values for {x:?} ({})", b.len(), w(*x))));
                    }
                    CpuOp::Bias { x: *x, b }
                }
                Op::ShortConv { state, w: wm } => {
                    let conv = boostr::conv::ShortConv { kernel: c.conv_kernel as u32 };
                    conv.check().map_err(|e| EngineError::Unsupported { what: format!("{}: {e}", wm.name) })?;
                    if wm.rows != c.dim || wm.cols != c.conv_kernel || *state >= c.conv_layers() {
                        return Err(bad(format!("short conv {} ({} x {}, state {state} of {})", wm.name, wm.rows, wm.cols, c.conv_layers())));
                    }
                    CpuOp::ShortConv { state: *state, conv, w: ld.mat_f32(wm)? }
                }
                Op::LmHead { w: head, softcap } => CpuOp::LmHead { g: ld.group(std::slice::from_ref(head), c.dim, c.vocab, "LM head")?, softcap: *softcap },
            });
            if let Op::QkvRope { layer, .. } | Op::Attention { layer, .. } = op
                && *layer >= c.kv_layers()
            {
                let kind = if matches!(op, Op::Attention { .. }) { "an attention op" } else { "a Q/K/V RoPE op" };
                return Err(bad(format!("{kind} names cache layer {layer} of {}", c.kv_layers())));
            }
        }
        if c.n_kv_heads == 0 || !c.n_heads.is_multiple_of(c.n_kv_heads) || c.rope_dim > hd || hd == 0 {
            return Err(bad(format!("{} heads over {} KV heads of {hd}, rope dimension {}", c.n_heads, c.n_kv_heads, c.rope_dim)));
        }
        let threads = threads.max(1);
        let widths = state::SLOTS.iter().map(|&s| graph.width(s)).collect();
        let model = Model { cfg: c.clone(), widths, ops, kernels, int8, pool: Mutex::new(Pool::new(threads)?), threads };
        Ok(CpuBackend { model: Arc::new(model) })
    }
}

impl Backend for CpuBackend {
    fn new_batch(&self, opts: &super::batch::BatchOpts) -> Result<Box<dyn super::batch::BatchState>, EngineError> {
        Ok(Box::new(batch::CpuBatch::new(self.model.clone(), opts)?))
    }
    fn new_state(&self, opts: &StateOpts) -> Result<Box<dyn BackendState>, EngineError> {
        Ok(Box::new(state::CpuState::new(self.model.clone(), opts)?))
    }
    fn device_name(&self) -> String {
        let t = self.model.threads;
        format!("CPU ({t} thread{})", if t == 1 { "" } else { "s" })
    }
    fn is_gpu(&self) -> bool {
        false
    }
}
