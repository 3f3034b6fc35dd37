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

use std::collections::HashMap;
use std::sync::Arc;

use boostr::act::{Act, ActIo, ActKind, ActPlan, GluInput};
use boostr::attention::{AttnOptions, DecodePlan, PrefillPlan, QueryLayout};
use boostr::bias::BiasPlan;
use boostr::conv::{ShortConv, ShortConvIo, ShortConvPlan};
use boostr::embedding::EmbeddingPlan;
use boostr::kv_cache::{KvCache, KvDtype};
use boostr::norm::{Norm, NormIo, NormPlan};
use boostr::ops_common::{GpuView, OpPlan};
use boostr::quant::{GemmPlan, GemvIo, GemvOutput, GemvPlan, Prologue, Q8Activations, Q8GemvPlan, QuantGemm, QuantGemv, QuantGemvQ8, RopeKv, WeightKind};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, Plan};

use super::super::EngineError;
use super::super::backend::CONV_RING;
use super::super::graph::{ModelGraph, Op, Slot};
use super::super::options::DecodeGemv;
use super::super::tuning::GpuTuning;
use super::fuse::{Fusions, Input, act_kind, fuse_decode};
use super::links::{Links, epilogue_links};
pub(crate) use super::tuning::prefill_qkv_splits;
use super::tuning::{decode_fusions, f32_rows, f32_threads, q8_config, qkv_split_k};
use super::weights::GpuWeights;
use super::{dev_err, ops_err, quant_err};

/// Decode (one token, GEMV, logits), prefill (a chunk, GEMM, no logits), or the head of a
/// prefill (only the LM head's GEMV, over the decode slots' `Normed` row that the step copies
/// from the chunk's last row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Decode,
    Prefill { max_tok: usize },
    Head,
}

impl Mode {
    fn rows(self) -> usize {
        match self {
            Mode::Decode | Mode::Head => 1,
            Mode::Prefill { max_tok } => max_tok,
        }
    }
}

/// Activation buffers of one mode, `rows x width(slot)` f32 each.
pub(crate) struct Slots {
    bufs: HashMap<Slot, Arc<GpuBuffer>>,
}

impl Slots {
    /// `qkv_splits`: the K splits of the mode's Q/K/V projection ([`prefill_qkv_splits`]), each
    /// partial sum needing its own `rows x width` of the Q/K/V slot.
    pub(crate) fn new(ctx: &GpuContext, graph: &ModelGraph, rows: usize, qkv_splits: u32) -> Result<Slots, EngineError> {
        let mut bufs = HashMap::new();
        for s in graph.slots() {
            let r = match s {
                Slot::Logits => 1,
                Slot::Qkv => rows * qkv_splits.max(1) as usize,
                _ => rows,
            };
            let bytes = (r * graph.width(s) * 4) as u64;
            let b = ctx.alloc(bytes.max(16), BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
            bufs.insert(s, b);
        }
        Ok(Slots { bufs })
    }

    pub(crate) fn buf(&self, s: Slot) -> &Arc<GpuBuffer> {
        &self.bufs[&s]
    }

    fn view(&self, s: Slot) -> GpuView {
        GpuView::whole(self.buf(s))
    }

    fn bind(&self, s: Slot) -> Binding {
        Binding::whole(self.buf(s))
    }
}

/// What a mode's plan reads and writes besides its slots.
pub(crate) struct PlanInputs<'a> {
    pub(crate) graph: &'a ModelGraph,
    pub(crate) weights: &'a GpuWeights,
    pub(crate) cache: &'a KvCache,
    /// Token ids: `[ubatch prompt slots | 1 argmax slot]`.
    pub(crate) ids: &'a Arc<GpuBuffer>,
    /// Per layer: the inverse frequencies on the GPU.
    pub(crate) freqs: &'a [Arc<GpuBuffer>],
    /// Per conv layer: the ring of `Bx` rows `[CONV_RING][dim]` f32, shared by both modes.
    pub(crate) conv: &'a [Arc<GpuBuffer>],
    /// The decode GEMVs' activations (f32, or int8 for wide quantized projections).
    pub(crate) decode_gemv: DecodeGemv,
    /// The measured constants and their overrides.
    pub(crate) tuning: &'a GpuTuning,
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

fn rope_params(graph: &ModelGraph, base: f32, linear: f32, neox: bool) -> RopeParams {
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

/// [`build`], with the index of each layer's first dispatch in the plan.
pub(crate) fn build_layers(ctx: &GpuContext, inp: &PlanInputs, slots: &Slots, mode: Mode) -> Result<(Plan, Vec<usize>), EngineError> {
    let (g, c) = (inp.graph, &inp.graph.cfg);
    let rows = mode.rows();
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut plan = Plan::new();
    let k_of = |i: usize| match &g.ops[i] {
        Op::Linear { ws, .. } => ws.first().map_or(0, |w| w.cols),
        Op::LmHead { w, .. } => w.cols,
        _ => 0,
    };
    let (allow, epilogues) = decode_fusions(inp.tuning);
    let rope_ok = |i: usize| rope_fusable(ctx, &env, inp, i);
    let fused = if mode == Mode::Decode { fuse_decode(&g.ops, allow, &k_of, &rope_ok) } else { Fusions::none(g.ops.len()) };
    let links = if mode == Mode::Decode { epilogue_links(ctx, &env, inp, &fused, epilogues)? } else { Links::default() };
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
        let gemv = |x: Slot, out: Slot| -> GemvFusion {
            // Accumulating GEMVs add into the residual stream instead of writing their slot.
            let out = slots.bind(if f.accumulate { Slot::Hidden } else { out });
            let (accumulate, rope) = (f.accumulate, f.rope);
            match &f.input {
                Input::Norm(w) => GemvFusion { x: slots.bind(Slot::Hidden), out, norm: Some(w.clone()), glu: None, accumulate, rope },
                Input::Glu(act, src) => GemvFusion { x: slots.bind(*src), out, norm: None, glu: Some(*act), accumulate, rope },
                Input::Plain => GemvFusion { x: slots.bind(x), out, norm: None, glu: None, accumulate, rope },
            }
        };
        match op {
            Op::Embed { scale, .. } => {
                let table = inp.weights.embedding(g, i)?;
                // Prefill reads ids[token ..]; decode reads the one slot the step names.
                let ids = GpuView::whole(inp.ids);
                let p = EmbeddingPlan::new(ctx, table, &ids, rows, *scale, Some(slots.view(Slot::Hidden))).map_err(ops_err)?;
                plan.append(p.plan());
            }
            Op::Norm { w, out, .. } if f.materialize => {
                let io = NormIo { x: slots.view(Slot::Hidden), w: inp.weights.vec(&w.name)?.clone(), b: None, residual: None, out: Some(slots.view(*out)) };
                plan.append(NormPlan::new(ctx, &Norm::rms(), &io, w.len, rows, c.norm_eps).map_err(ops_err)?.plan());
            }
            Op::AddNorm { w, out, .. } if f.materialize => {
                // The residual add went into the producing GEMV: only the norm of Hidden is left.
                let io = NormIo { x: slots.view(Slot::Hidden), w: inp.weights.vec(&w.name)?.clone(), b: None, residual: None, out: Some(slots.view(*out)) };
                plan.append(NormPlan::new(ctx, &Norm::rms(), &io, w.len, rows, c.norm_eps).map_err(ops_err)?.plan());
            }
            Op::Norm { x, w, out } => {
                let io = NormIo { x: slots.view(*x), w: inp.weights.vec(&w.name)?.clone(), b: None, residual: None, out: Some(slots.view(*out)) };
                plan.append(NormPlan::new(ctx, &Norm::rms(), &io, w.len, rows, c.norm_eps).map_err(ops_err)?.plan());
            }
            Op::AddNorm { x, w, out } => {
                let io = NormIo {
                    x: slots.view(*x),
                    w: inp.weights.vec(&w.name)?.clone(),
                    b: None,
                    residual: Some(slots.view(Slot::Hidden)),
                    out: Some(slots.view(*out)),
                };
                plan.append(NormPlan::new(ctx, &Norm { residual: true, ..Norm::rms() }, &io, w.len, rows, c.norm_eps).map_err(ops_err)?.plan());
            }
            Op::Linear { x, out, .. } => linear(ctx, &env, &mut plan, inp, i, gemv(*x, *out), g.width(*out), c.norm_eps, mode, &links)?,
            Op::LmHead { softcap, .. } => {
                if let Some(cap) = softcap {
                    return Err(EngineError::Unsupported { what: format!("final logit soft-capping ({cap}) on the GPU") });
                }
                if matches!(mode, Mode::Decode | Mode::Head) {
                    linear(ctx, &env, &mut plan, inp, i, gemv(Slot::Normed, Slot::Logits), c.vocab, c.norm_eps, Mode::Decode, &links)?;
                }
            }
            Op::QkvRope { layer, qk_norm, rope, neox, .. } => {
                let cfg = QkvRope {
                    style: if *neox { RopeStyle::Neox } else { RopeStyle::Normal },
                    rope: true,
                    qk_norm: qk_norm.is_some(),
                    norm_offset: false,
                    kv_write: Some(inp.cache.config().dtype),
                };
                let rp = rope_params(g, rope.base, rope.linear_factor, *neox);
                let (qw, kw) = match qk_norm {
                    Some((q, k)) => (Some(inp.weights.vec(&q.name)?.binding.clone()), Some(inp.weights.vec(&k.name)?.binding.clone())),
                    None => (None, None),
                };
                let x = slots.bind(Slot::Qkv);
                let inputs = QkvRopeInputs {
                    x: &x,
                    layout: QkvLayout::packed(rows, c.n_heads, c.n_kv_heads, c.head_dim),
                    rope: &rp,
                    positions: &RopePositions::Step,
                    qw: qw.as_ref(),
                    kw: kw.as_ref(),
                    eps: c.norm_eps,
                    cache: Some((inp.cache, *layer)),
                };
                let freqs = Binding::whole(&inp.freqs[*layer]);
                // The Q/K/V GEMM before it (a bias at most between) split over K?
                let producer = (0..i).rev().find(|&j| !matches!(g.ops[j], Op::Bias { .. }));
                let p = match (mode, producer) {
                    (Mode::Prefill { max_tok }, Some(j)) if qkv_split_k(ctx, inp, j, max_tok) > 1 => {
                        QkvRopePlan::with_partial_sum(ctx, &cfg, &inputs, &freqs, max_tok * g.width(Slot::Qkv))
                    }
                    _ => QkvRopePlan::with_freqs(ctx, &cfg, &inputs, &freqs),
                };
                plan.append(p.map_err(ops_err)?.plan());
            }
            Op::Attention { layer, window } => {
                let opts = AttnOptions { scale: c.attn_scale, softcap: c.attn_softcap, window: *window };
                let (q, out) = (slots.bind(Slot::Qkv), slots.bind(Slot::Attn));
                match mode {
                    Mode::Decode | Mode::Head => {
                        let mut b = DecodePlan::builder(ctx, &q, 0, c.n_heads, inp.cache, *layer, &opts).output(&out, 0);
                        if let Some(t) = inp.tuning.attn_tuning {
                            b = b.tuning(t.heads, t.keys, t.target_wgs);
                        }
                        if let Some(kv) = inp.tuning.attn_single_kv {
                            b = b.single_split_up_to(kv);
                        }
                        if let Some(consumer) = links.attention.get(&i) {
                            b = b.quantized_output(consumer);
                        }
                        plan.append(b.build().map_err(ops_err)?.plan());
                    }
                    Mode::Prefill { max_tok } => {
                        let ql = QueryLayout { n_tok: max_tok, n_q: c.n_heads, q_off: 0, tok_stride: c.qkv_dim() };
                        let mut b = PrefillPlan::builder(ctx, &q, &ql, inp.cache, *layer, &opts).output(&out, 0);
                        if let Some(kind) = inp.tuning.prefill_attn {
                            b = b.kernel(kind);
                        }
                        plan.append(b.build().map_err(ops_err)?.plan());
                    }
                }
            }
            Op::Bias { x, bs } => {
                let mut b: Vec<f32> = Vec::new();
                for v in bs {
                    b.extend_from_slice(inp.weights.host_vec(&v.name)?);
                }
                if b.len() != g.width(*x) {
                    return Err(EngineError::BadConfig { reason: format!("a bias of {} values for {x:?} ({} wide)", b.len(), g.width(*x)) });
                }
                let bb = ctx.upload(bytemuck::cast_slice(&b)).map_err(|e| dev_err(ctx, e))?;
                plan.append(BiasPlan::new(ctx, &slots.view(*x), &GpuView::whole(&bb), b.len(), rows).map_err(ops_err)?.plan());
            }
            Op::ShortConv { state, w } => {
                let conv = ShortConv { kernel: c.conv_kernel as u32 };
                let io = ShortConvIo {
                    bcx: slots.view(Slot::ConvIn),
                    w: inp.weights.vec(&w.name)?.clone(),
                    state: Some(GpuView::whole(&inp.conv[*state])),
                    out: Some(slots.view(Slot::Conv)),
                };
                plan.append(ShortConvPlan::new(ctx, &conv, &io, c.dim, rows, CONV_RING).map_err(ops_err)?.plan());
            }
            Op::Glu { act, x, out } => {
                let kind = act_kind(*act);
                let io = ActIo { a: slots.view(*x), b: None, out: Some(slots.view(*out)) };
                plan.append(ActPlan::new(ctx, &Act { kind, input: GluInput::Packed }, &io, c.ffn_dim, rows).map_err(ops_err)?.plan());
            }
        }
    }
    Ok((plan, layer_starts))
}

/// The bindings of one linear op and what its GEMV fuses (decode).
struct GemvFusion {
    x: Binding,
    out: Binding,
    /// The RMSNorm prologue's weight (x is then the residual stream).
    norm: Option<String>,
    /// The GLU prologue (x is then the packed `[gate | up]` rows).
    glu: Option<ActKind>,
    /// `out += x Wᵀ` (out is then the residual stream).
    accumulate: bool,
    /// The `QkvRope` op whose RoPE and KV write the GEMV runs (decode Q/K/V projection).
    rope: Option<usize>,
}

/// One GEMV (decode) or GEMM (prefill) per part of the op's weights, each writing its columns.
#[allow(clippy::too_many_arguments)]
fn linear(
    ctx: &GpuContext,
    env: &KernelEnv,
    plan: &mut Plan,
    inp: &PlanInputs,
    op: usize,
    f: GemvFusion,
    width: usize,
    eps: f32,
    mode: Mode,
    links: &Links,
) -> Result<(), EngineError> {
    let (x, y) = (f.x, f.out);
    let parts = inp.weights.linear_parts(inp.graph, op)?;
    let k = parts[0].w.cols;
    let int8 = uses_int8(inp, op, mode);
    // The int8 activations all parts read: written by the producing GEMV's epilogue, or
    // quantized once in the dispatch before them.
    let xa = if let Some(t) = links.targets.get(&op) {
        Some(t.clone())
    } else if int8 {
        let name = &parts[0].w.name;
        let xa = match (&f.norm, f.glu) {
            (Some(n), _) => Q8Activations::with_rms_norm(ctx, &x, &inp.weights.vec(n)?.binding, 1, k, eps, false),
            (None, Some(act)) => Q8Activations::with_glu(ctx, &x, act, 1, k),
            (None, None) => Q8Activations::new(ctx, &x, 1, k),
        }
        .map_err(|e| quant_err(ctx, name, e))?;
        plan.append(xa.plan());
        Some(xa)
    } else {
        None
    };
    let c = &inp.graph.cfg;
    let rope_layer = f.rope.and_then(|r| match &inp.graph.ops[r] {
        Op::QkvRope { layer, .. } => Some(*layer),
        _ => None,
    });
    let freqs = rope_layer.map(|l| Binding::whole(&inp.freqs[l]));
    let rope = rope_layer.zip(freqs.as_ref()).map(|(layer, freqs)| RopeKv {
        n_q: c.n_heads,
        n_kv: c.n_kv_heads,
        head_dim: c.head_dim,
        rot_dim: c.rope_dim,
        freqs,
        cache: inp.cache,
        layer,
    });
    for part in parts {
        let w = &part.w;
        let output = if rope.is_some() {
            GemvOutput::Single(y.clone())
        } else if let Some(qkv) = qkv_outputs(ctx, inp, op, mode, &y, parts.len()) {
            qkv
        } else if parts.len() == 1 && w.rows == width {
            GemvOutput::Single(y.clone())
        } else {
            GemvOutput::Columns { y: y.clone(), stride: width, offset: part.col0 }
        };
        let split_qkv = matches!(output, GemvOutput::Qkv { .. });
        let kind = WeightKind::of(w.format);
        match (mode, &xa) {
            (Mode::Decode | Mode::Head, Some(xa)) => {
                let cfg = QuantGemvQ8 { accumulate: f.accumulate, rms_scale: xa.deferred_rms().is_some(), split_qkv, ..q8_config(inp.tuning, env, w) };
                let p = match links.producers.get(&op) {
                    _ if rope.is_some() => {
                        let rk = rope.as_ref().expect("checked");
                        Q8GemvPlan::with_rope_kv(ctx, &QuantGemvQ8 { rope_kv: true, ..cfg }, w, xa, &y, rk)
                    }
                    Some(l) => {
                        let mut cfg = QuantGemvQ8 { epilogue: l.epilogue, ..cfg };
                        if let Some(s) = l.shape {
                            (cfg.rows_per_workgroup, cfg.threads, cfg.unroll, cfg.subgroup_rows, cfg.row_groups) =
                                (s.rows, s.threads, s.unroll, s.subgroup_rows, 1);
                        }
                        Q8GemvPlan::with_epilogue(ctx, &cfg, w, xa, &output, &l.target, l.norm.as_ref())
                    }
                    None => Q8GemvPlan::new(ctx, &cfg, w, xa, &output),
                };
                plan.append(p.map_err(|e| quant_err(ctx, &w.name, e))?.plan());
            }
            (Mode::Decode | Mode::Head, None) => {
                // Bounds are validated by the plan before it drops the runtime checks.
                let prologue = match (&f.norm, f.glu) {
                    (Some(_), _) => Prologue::RmsNorm { gemma: false, stage_k: inp.tuning.norm_stage_k },
                    (None, Some(act)) => Prologue::Glu { act },
                    (None, None) => Prologue::None,
                };
                let base = QuantGemv::new(kind, env, 1);
                let cfg = QuantGemv {
                    unchecked: true,
                    prologue,
                    split_qkv,
                    accumulate: f.accumulate,
                    rows_per_workgroup: f32_rows(inp.tuning, env, w),
                    threads: f32_threads(inp.tuning, base.threads),
                    ..base
                };
                let norm_weight = match &f.norm {
                    Some(n) => Some(inp.weights.vec(n)?.binding.clone()),
                    None => None,
                };
                let io = GemvIo { x: x.clone(), norm_weight, eps, output };
                let p = match &rope {
                    Some(rk) => GemvPlan::with_rope_kv(ctx, &QuantGemv { rope_kv: true, ..cfg }, w, &io, rk),
                    None => GemvPlan::new(ctx, &cfg, w, &io),
                };
                plan.append(p.map_err(|e| quant_err(ctx, &w.name, e))?.plan());
            }
            (Mode::Prefill { max_tok }, _) => {
                let cfg = QuantGemm { unchecked: true, ..QuantGemm::new(kind, ctx) };
                let p = match qkv_split_k(ctx, inp, op, max_tok) {
                    1 => GemmPlan::with_output(ctx, &cfg, w, &x, &output, max_tok),
                    splits => GemmPlan::with_split_k(ctx, &cfg, w, &x, &y, max_tok, splits),
                };
                plan.append(p.map_err(|e| quant_err(ctx, &w.name, e))?.plan());
            }
        }
    }
    Ok(())
}

/// Whether linear op `op`'s decode GEMV can run the next op's RoPE and KV write (boostr's
/// `rope_kv` epilogue): one part of exactly the Q, K and V rows, an f16 cache of one segment per
/// layer, 8 storage bindings, and even rows per workgroup (and per subgroup) in its layout.
fn rope_fusable(ctx: &GpuContext, env: &KernelEnv, inp: &PlanInputs, op: usize) -> bool {
    let c = &inp.graph.cfg;
    let Ok(parts) = inp.weights.linear_parts(inp.graph, op) else { return false };
    let cc = inp.cache.config();
    let one_segment = inp.cache.segment_len() >= inp.cache.capacity();
    if parts.len() != 1
        || parts[0].w.rows != (c.n_heads + 2 * c.n_kv_heads) * c.head_dim
        || cc.dtype != KvDtype::F16
        || !one_segment
        || ctx.capabilities().limits.max_storage_buffers_per_shader_stage < 8
    {
        return false;
    }
    let w = &parts[0].w;
    if uses_int8(inp, op, Mode::Decode) {
        let q = q8_config(inp.tuning, env, w);
        let sg_rows = if q.subgroups && env.subgroups { q.subgroup_rows } else { 0 };
        q.rows_per_workgroup.is_multiple_of(2) && sg_rows.is_multiple_of(2)
    } else {
        f32_rows(inp.tuning, env, w).is_multiple_of(2)
    }
}

/// Whether linear op `op` runs as integer-dot GEMVs (decode, the int8 path, every part a
/// quantized format; false for an op without weights).
pub(super) fn uses_int8(inp: &PlanInputs, op: usize, mode: Mode) -> bool {
    let Some(parts) = inp.weights.linear.get(&op) else { return false };
    matches!(mode, Mode::Decode | Mode::Head)
        && inp.decode_gemv.int8_for(inp.graph.cfg.dim)
        && parts.iter().all(|p| QuantGemvQ8::supports(WeightKind::of(p.w.format)))
}

/// The decode Q/K/V projection's three outputs: views of the packed `[q | k | v]` row, written
/// by boostr's fused QKV GEMV (`split_qkv`, one dispatch, three outputs), where the matrix is one
/// part of exactly Q, K and V rows and the views' offsets meet the adapter's alignment (else
/// the same row is written as one output).
fn qkv_outputs(ctx: &GpuContext, inp: &PlanInputs, op: usize, mode: Mode, y: &Binding, n_parts: usize) -> Option<GemvOutput> {
    let (g, c) = (inp.graph, &inp.graph.cfg);
    let Op::Linear { out: Slot::Qkv, ws, .. } = &g.ops[op] else { return None };
    let rows = [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim];
    let total: usize = rows.iter().sum();
    let align = ctx.capabilities().limits.min_storage_buffer_offset_alignment as u64;
    let aligned = |elems: usize| (elems as u64 * 4).is_multiple_of(align);
    let matrix_rows = inp.weights.linear.get(&op).and_then(|p| p.first()).map(|p| p.w.rows);
    if mode != Mode::Decode || n_parts != 1 || ws.len() != 3 || matrix_rows != Some(total) || !aligned(rows[0]) || !aligned(rows[0] + rows[1]) {
        return None;
    }
    let view = |off: usize, n: usize| Binding { buffer: y.buffer.clone(), offset: y.offset + off as u64 * 4, size: n as u64 * 4 };
    Some(GemvOutput::Qkv { q: view(0, rows[0]), k: view(rows[0], rows[1]), v: view(rows[0] + rows[1], rows[2]), rows })
}
