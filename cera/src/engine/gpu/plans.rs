//! The graph turned into boostr plans for one sequence: a decode plan (one token, the GEMV
//! kernels, the LM head) and a prefill plan (up to a ubatch of tokens, the GEMM kernels,
//! cooperative-matrix where the adapter has them; no LM head). Both bind the sequence's own
//! activation buffers and KV cache; everything is made here, so recording a step creates
//! nothing.
//!
//! The decode plan fuses what the graph writes as separate ops ([`super::fuse`]): the residual
//! add goes into the GEMV producing the delta (`accumulate`), the RMSNorm into the GEMV
//! consuming it (`Prologue::RmsNorm`, reading the residual stream), the GLU into the down
//! projection (`Prologue::Glu`), and RoPE with the KV write into the Q/K/V GEMV, so a llama layer
//! is 5 dispatches.
//!
//! On the int8 path ([`DecodeGemv`]) each projection instead reads activations quantized to
//! int8, which takes the same fusions: the quantization runs in the epilogue of the GEMV or the
//! attention that produces them ([`super::links`]), else in a dispatch of its own
//! (`Q8Activations::with_rms_norm`, `with_glu`, `new`); a llama layer is 5 dispatches there too,
//! each GEMV reading a quarter of the activation bytes with a quarter of the instructions.
//!
//! The prefill plan records the graph's ops as they are, except that a Q/K/V GEMM of too few
//! blocks to fill the GPU is split over K, and the RoPE kernel after it adds the two partial
//! sums ([`super::tuning::qkv_split_k`]). The measured constants and their overrides are
//! [`GpuTuning`]'s, applied in [`super::tuning`].
//!
//! Each op's dispatches are built in [`super::plan_ops`] (one match over the op kinds, one
//! function per kind); this file holds the loop over the graph, the slots and the inputs.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use boostr::conv::ConvSeqs;
use boostr::kv_cache::{KvCache, KvDtype};
use boostr::ops_common::GpuView;
use boostr::paged::{PagedBatch, PagedKvCache};
use boostr::rope::{RopeParams, RopeScaling, RopeStyle};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, Plan};

use super::super::EngineError;
use super::super::graph::{ModelGraph, Op, Slot};
use super::super::options::DecodeGemv;
use super::super::tuning::GpuTuning;
use super::dev_err;
use super::fuse::{Allow, Fusions, fuse_decode, fuse_split_sums};
use super::links::{Links, epilogue_links};
use super::plan_ops::linear::rope_fusable;
pub(super) use super::plan_ops::linear::uses_int8;
use super::plan_ops::{PlanCx, record_op};
pub(crate) use super::tuning::prefill_qkv_splits;
use super::tuning::{batch_op_split_k, decode_fusions};
use super::weights::GpuWeights;

/// Decode (one token, GEMV, logits), prefill (a chunk, GEMM, no logits), or the head of a
/// prefill (only the LM head's GEMV, over the decode slots' `Normed` row that the step copies
/// from the chunk's last row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Decode,
    Prefill {
        max_tok: usize,
    },
    Head,
    /// Several sequences' tokens (up to `max_tok`) through the paged cache: the prefill plan's
    /// GEMMs over every row, RoPE at each row's position, the paged KV write and attention;
    /// no LM head (the batch state runs it over the rows that want logits).
    Batch {
        max_tok: usize,
    },
}

impl Mode {
    pub(super) fn rows(self) -> usize {
        match self {
            Mode::Decode | Mode::Head => 1,
            Mode::Prefill { max_tok } | Mode::Batch { max_tok } => max_tok,
        }
    }
}

/// Activation buffers of one mode, `rows x width(slot)` f32 each, and the f16 copy of a GEMM's
/// input rows that the plans share ([`Slots::half`]).
pub(crate) struct Slots {
    bufs: HashMap<Slot, Arc<GpuBuffer>>,
    rows: usize,
    /// The widest input of a linear op.
    max_k: usize,
    half: OnceLock<Arc<GpuBuffer>>,
    partials: OnceLock<Arc<GpuBuffer>>,
}

impl Slots {
    /// `qkv_splits`: the K splits of the mode's Q/K/V projection ([`prefill_qkv_splits`]), each
    /// partial sum needing its own `rows x width` of the Q/K/V slot.
    pub(crate) fn new(ctx: &GpuContext, graph: &ModelGraph, rows: usize, qkv_splits: u32) -> Result<Slots, EngineError> {
        Self::with_logit_rows(ctx, graph, rows, qkv_splits, 1)
    }

    /// [`Self::new`] with `logit_rows` rows of logits (a batched step's LM head).
    pub(crate) fn with_logit_rows(ctx: &GpuContext, graph: &ModelGraph, rows: usize, qkv_splits: u32, logit_rows: usize) -> Result<Slots, EngineError> {
        let mut bufs = HashMap::new();
        for s in graph.slots() {
            let r = match s {
                Slot::Logits => logit_rows,
                Slot::Qkv => rows * qkv_splits.max(1) as usize,
                _ => rows,
            };
            let bytes = (r * graph.width(s) * 4) as u64;
            let b = ctx.alloc(bytes.max(16), BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
            bufs.insert(s, b);
        }
        let max_k = graph.ops.iter().filter_map(|op| if let Op::Linear { ws, .. } = op { ws.first().map(|w| w.cols) } else { None }).max().unwrap_or(0);
        Ok(Slots { bufs, rows, max_k, half: OnceLock::new(), partials: OnceLock::new() })
    }

    /// `rows x` the widest linear input, f16: where a plan's GEMMs read f16 activations, each
    /// rounds its input rows into this just before it runs (`plan_ops::linear`). Allocated by
    /// the first plan that asks, so plans without such GEMMs cost no memory.
    pub(super) fn half(&self, ctx: &GpuContext) -> Result<&Arc<GpuBuffer>, EngineError> {
        if let Some(b) = self.half.get() {
            return Ok(b);
        }
        let bytes = (self.rows * self.max_k * 2) as u64;
        let b = ctx.alloc(bytes.max(16), BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        Ok(self.half.get_or_init(|| b))
    }

    /// `rows x row_elems` f32: the partial sums of the GEMMs split over K in a batched plan
    /// (`tuning::batch_split_k`), each summed into its output before the next GEMM runs. Every
    /// caller passes the plan's most (`tuning::batch_split_row_elems`); allocated by the first.
    pub(super) fn partials(&self, ctx: &GpuContext, row_elems: usize) -> Result<&Arc<GpuBuffer>, EngineError> {
        if let Some(b) = self.partials.get() {
            return Ok(b);
        }
        let bytes = (self.rows * row_elems * 4) as u64;
        let b = ctx.alloc(bytes.max(16), BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        Ok(self.partials.get_or_init(|| b))
    }

    /// The rows each slot holds.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn buf(&self, s: Slot) -> &Arc<GpuBuffer> {
        &self.bufs[&s]
    }

    pub(super) fn view(&self, s: Slot) -> GpuView {
        GpuView::whole(self.buf(s))
    }

    pub(super) fn bind(&self, s: Slot) -> Binding {
        Binding::whole(self.buf(s))
    }
}

/// What a mode's plan reads and writes besides its slots.
pub(crate) struct PlanInputs<'a> {
    pub(crate) graph: &'a ModelGraph,
    pub(crate) weights: &'a GpuWeights,
    /// The sequence's contiguous cache (decode, prefill and head plans).
    pub(crate) cache: Option<&'a KvCache>,
    /// The paged cache and the step's batch (batched plans).
    pub(crate) paged: Option<(&'a PagedKvCache, &'a PagedBatch)>,
    /// The most positions a sequence of the paged cache reaches (0 without one).
    pub(crate) paged_ctx: usize,
    /// Token ids: `[ubatch prompt slots | 1 argmax slot]`.
    pub(crate) ids: &'a Arc<GpuBuffer>,
    /// Per layer: the inverse frequencies on the GPU.
    pub(crate) freqs: &'a [Arc<GpuBuffer>],
    /// Per conv layer: the ring of `Bx` rows `[CONV_RING][dim]` f32, shared by both modes; in a
    /// batched plan, the rings of every sequence slot `[max_seqs][CONV_RING][dim]`.
    pub(crate) conv: &'a [Arc<GpuBuffer>],
    /// A batched plan's per-step runs of the conv layers (`None` without conv layers).
    pub(crate) conv_seqs: Option<&'a ConvSeqs>,
    /// The decode GEMVs' activations (f32, or int8 for wide quantized projections).
    pub(crate) decode_gemv: DecodeGemv,
    /// The measured constants and their overrides.
    pub(crate) tuning: &'a GpuTuning,
    /// A batched plan runs its decode rows through the multi-row GEMV (else through the GEMM
    /// with the prompt rows): chosen per batch state, so every row of one state's steps takes
    /// the same kernel whatever shares its step.
    pub(crate) batch_decode_gemv: bool,
    /// A prefill plan of a few rows whose projections take every row through the multi-row
    /// GEMV (reading the weights once for all of them) and whose LM head runs over every row:
    /// a speculative verification step ([`super::state`]'s `verify`).
    pub(crate) prefill_gemv: bool,
    /// A batched plan whose every row is a decode row (the decode lane of a batched step,
    /// [`super::batch`]): the projections take the verification plan's fusions
    /// ([`fuse_rows`]), with no GEMM for prompt rows; the LM head is not in it.
    pub(crate) rows_only: bool,
}

impl<'a> PlanInputs<'a> {
    /// The contiguous cache ([`EngineError::Usage`] for a batched plan, which has none).
    pub(crate) fn cache(&self) -> Result<&'a KvCache, EngineError> {
        self.cache.ok_or_else(|| EngineError::Usage("a sequence plan without a contiguous KV cache".into()))
    }

    /// The paged cache and the batch ([`EngineError::Usage`] for a sequence's plan).
    pub(crate) fn paged(&self) -> Result<(&'a PagedKvCache, &'a PagedBatch), EngineError> {
        self.paged.ok_or_else(|| EngineError::Usage("a batched plan without a paged KV cache".into()))
    }
}

/// The inverse RoPE frequencies of a layer's op (frequency factors folded in).
pub(crate) fn inv_freqs(graph: &ModelGraph, weights: &GpuWeights, op: &Op) -> Result<Vec<f32>, EngineError> {
    let Op::QkvRope { rope, neox, freq_factors, .. } = op else { return Ok(vec![]) };
    let mut f = rope_params(graph, rope.base, rope.linear_factor, *neox).inv_freqs();
    if let Some(ff) = freq_factors {
        let host = weights.host_vec(&ff.name)?;
        if host.len() != f.len() {
            return Err(EngineError::TensorShape { name: ff.name.clone(), dims: vec![host.len() as u64], expected: vec![f.len() as u64] });
        }
        f.iter_mut().zip(host).for_each(|(a, b)| *a /= *b);
    }
    Ok(f)
}

pub(super) fn rope_params(graph: &ModelGraph, base: f32, linear: f32, neox: bool) -> RopeParams {
    let c = &graph.cfg;
    RopeParams {
        head_dim: c.head_dim,
        rot_dim: c.rope_dim,
        base,
        scaling: if linear == 1.0 { RopeScaling::None } else { RopeScaling::Linear { factor: linear } },
        style: if neox { RopeStyle::Neox } else { RopeStyle::Normal },
    }
}

pub(crate) fn kv_dtype(kv: super::super::KvType) -> Result<KvDtype, EngineError> {
    match kv {
        super::super::KvType::F16 => Ok(KvDtype::F16),
        super::super::KvType::Q8_0 => Ok(KvDtype::Q8_0),
        super::super::KvType::F32 => Err(EngineError::Unsupported { what: "an f32 KV cache on the GPU (f16 or q8_0)".into() }),
    }
}

/// Builds the plan of `mode` over `slots`.
pub(crate) fn build(ctx: &GpuContext, inp: &PlanInputs, slots: &Slots, mode: Mode) -> Result<Plan, EngineError> {
    Ok(build_layers(ctx, inp, slots, mode)?.0)
}

/// The LM head over up to `max_rows` normalised rows of `x` into `out` (a batched step's head).
pub(crate) fn build_head_rows(ctx: &GpuContext, inp: &PlanInputs, slots: &Slots, x: Binding, out: Binding, max_rows: usize) -> Result<Plan, EngineError> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let links = Links::default();
    let cx = PlanCx { ctx, env: &env, inp, slots, mode: Mode::Batch { max_tok: max_rows }, links: &links };
    let mut plan = Plan::new();
    super::plan_ops::lm_head_rows(&cx, &mut plan, x, out, max_rows)?;
    Ok(plan)
}

/// The fusions of a plan whose every row goes through the multi-row GEMV (a verification step,
/// `PlanInputs::prefill_gemv`): the decode plan's, but for RoPE and the epilogues. The RMSNorm
/// and the GLU go into the integer-dot GEMV's quantizer of the rows
/// (`Q8Activations::with_rms_norm`, `with_glu`) or into the f32 GEMV's prologue, and the
/// residual add into the GEMV producing the delta (`accumulate`): a llama layer is 10
/// dispatches instead of 14 on the int8 path, 6 instead of 10 on the f32 path.
fn fuse_rows(inp: &PlanInputs, allow: Allow) -> Fusions {
    let g = inp.graph;
    // A batched plan's head runs after it, from the `Normed` rows: nothing fuses into it.
    let head = !inp.rows_only;
    let k_of = |i: usize| match &g.ops[i] {
        Op::Linear { ws, .. } => Some(ws.first().map_or(0, |w| w.cols)),
        Op::LmHead { w, .. } if head => Some(w.cols),
        _ => None,
    };
    // The norm has no limit on the features (`--tune decode_fusion` still turns each fusion
    // off).
    let norm_max_k = if allow.norm_max_k > 0 { usize::MAX } else { 0 };
    fuse_decode(&g.ops, Allow { norm_max_k, rope: false, ..allow }, &k_of, &|_| false)
}

/// [`build`], with the index of each layer's first dispatch in the plan.
pub(crate) fn build_layers(ctx: &GpuContext, inp: &PlanInputs, slots: &Slots, mode: Mode) -> Result<(Plan, Vec<usize>), EngineError> {
    let g = inp.graph;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut plan = Plan::new();
    let k_of = |i: usize| match &g.ops[i] {
        Op::Linear { ws, .. } => Some(ws.first().map_or(0, |w| w.cols)),
        Op::LmHead { w, .. } => Some(w.cols),
        _ => None,
    };
    let (allow, epilogues) = decode_fusions(inp.tuning);
    let rope_ok = |i: usize| rope_fusable(ctx, &env, inp, i);
    let fused = match mode {
        Mode::Decode => fuse_decode(&g.ops, allow, &k_of, &rope_ok),
        Mode::Prefill { .. } if inp.prefill_gemv => fuse_rows(inp, allow),
        Mode::Batch { .. } if inp.rows_only => fuse_rows(inp, allow),
        Mode::Batch { .. } if !inp.batch_decode_gemv => fuse_split_sums(&g.ops, &|i| batch_op_split_k(ctx, g, inp.weights, inp.tuning, i, slots.rows())),
        _ => Fusions::none(g.ops.len()),
    };
    let links = if mode == Mode::Decode { epilogue_links(ctx, &env, inp, &fused, epilogues)? } else { Links::default() };
    let cx = PlanCx { ctx, env: &env, inp, slots, mode, links: &links };
    let mut layer_starts = Vec::new();
    let mut layer = None;
    for (i, op) in g.ops.iter().enumerate() {
        let f = &fused.ops[i];
        if f.skip || (mode == Mode::Head && !matches!(op, Op::LmHead { .. })) {
            continue;
        }
        if let Some(l) = op.layer()
            && layer != Some(l)
        {
            layer = Some(l);
            layer_starts.push(plan.dispatches().len());
        }
        record_op(&cx, &mut plan, i, op, f)?;
    }
    Ok((plan, layer_starts))
}
