//! Linear ops: one GEMV (decode; int8 activations on the int8 path, quantized by the producer's
//! epilogue or a dispatch of their own; a fused RMSNorm, GLU, residual add or RoPE + KV write)
//! or one GEMM (prefill; split over K where the Q/K/V grid is small) per part of the op's
//! weights.

use boostr::act::ActKind;
use boostr::kv_cache::KvDtype;
use boostr::quant::{
    GemmPlan, GemvIo, GemvOutput, GemvPlan, HalfRowsPlan, Prologue, Q8Activations, Q8GemvPlan, QuantGemm, QuantGemv, QuantGemvQ8, QuantMatrix, RopeKv,
    WeightKind,
};
use numr::gpu::{Binding, GpuContext, KernelEnv, Plan};

use super::super::super::EngineError;
use super::super::super::graph::{Op, Slot};
use super::super::fuse::{Fused, Input};
use super::super::plans::{Mode, PlanInputs, Slots};
use super::super::quant_err;
use super::super::tuning::{batch_split_k, batch_split_row_elems, f32_rows, f32_threads, q8_config, qkv_split_k};
use super::PlanCx;

/// The bindings of one linear op and what its GEMV fuses (decode).
pub(super) struct GemvFusion {
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

impl GemvFusion {
    /// `out = x Wᵀ`, nothing fused.
    pub(in super::super) fn plain(x: Binding, out: Binding) -> GemvFusion {
        GemvFusion { x, out, norm: None, glu: None, accumulate: false, rope: None }
    }
}

/// The bindings of a linear op reading `x` into `out`, fused as `f` says: accumulating GEMVs
/// add into the residual stream instead of writing their slot; a fused RMSNorm reads the
/// stream, a fused GLU the packed `[gate | up]` rows.
pub(super) fn gemv_fusion(slots: &Slots, f: &Fused, x: Slot, out: Slot) -> GemvFusion {
    let out = slots.bind(if f.accumulate { Slot::Hidden } else { out });
    let (accumulate, rope) = (f.accumulate, f.rope);
    match &f.input {
        Input::Norm(w) => GemvFusion { x: slots.bind(Slot::Hidden), out, norm: Some(w.clone()), glu: None, accumulate, rope },
        Input::Glu(act, src) => GemvFusion { x: slots.bind(*src), out, norm: None, glu: Some(*act), accumulate, rope },
        Input::Plain => GemvFusion { x: slots.bind(x), out, norm: None, glu: None, accumulate, rope },
    }
}

/// One linear op: its index, what its GEMV fuses, the output row's width, the RMSNorm's
/// epsilon, and the mode it is built for (the LM head's is always `Decode`).
pub(super) struct LinearArgs {
    pub(super) op: usize,
    pub(super) fusion: GemvFusion,
    pub(super) width: usize,
    pub(super) eps: f32,
    pub(super) mode: Mode,
    /// A batched GEMM split over K whose partial sums the next op adds up (`Fused::partial_sums`;
    /// 0: none).
    pub(super) partial_sums: u32,
}

/// One GEMV (decode) or GEMM (prefill) per part of the op's weights, each writing its columns.
pub(super) fn linear(cx: &PlanCx, plan: &mut Plan, a: LinearArgs) -> Result<(), EngineError> {
    let (ctx, env, inp, links) = (cx.ctx, cx.env, cx.inp, cx.links);
    let LinearArgs { op, fusion: f, width, eps, mode, partial_sums } = a;
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
    // A batched step's decode rows on the int8 path: the step's rows quantized once for every
    // part (the prompt rows' share is unused; the GEMM reads f32).
    let rows_gemv = match mode {
        Mode::Batch { max_tok } if inp.batch_decode_gemv => Some(max_tok),
        Mode::Prefill { max_tok } if inp.prefill_gemv => Some(max_tok),
        _ => None,
    };
    // A verification plan's rows take the RMSNorm or the GLU in their quantizer (`fuse_rows`).
    let xa_batch = match rows_gemv {
        Some(max_tok) if rows_int8(inp, op) => {
            let xa = match (&f.norm, f.glu) {
                (Some(n), _) => Q8Activations::with_rms_norm(ctx, &x, &inp.weights.vec(n)?.binding, max_tok, k, eps, false),
                (None, Some(act)) => Q8Activations::with_glu(ctx, &x, act, max_tok, k),
                (None, None) => Q8Activations::new(ctx, &x, max_tok, k),
            }
            .map_err(|e| quant_err(ctx, &parts[0].w.name, e))?;
            plan.append(xa.plan());
            Some(xa)
        }
        _ => None,
    };
    let c = &inp.graph.cfg;
    let rope_layer = f.rope.and_then(|r| match &inp.graph.ops[r] {
        Op::QkvRope { layer, .. } => Some(*layer),
        _ => None,
    });
    let freqs = rope_layer.map(|l| Binding::whole(&inp.freqs[l]));
    let rope = match rope_layer.zip(freqs.as_ref()) {
        Some((layer, freqs)) => {
            Some(RopeKv { n_q: c.n_heads, n_kv: c.n_kv_heads, head_dim: c.head_dim, rot_dim: c.rope_dim, freqs, cache: inp.cache()?, layer })
        }
        None => None,
    };
    // The GEMMs' activations rounded to f16 once for every part (`gemm_f16_input`).
    let x_half = half_input(cx, plan, &x, k, &parts[0].w.name)?;
    let gemm_x = x_half.clone().unwrap_or_else(|| x.clone());
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
                let p = match (&rope, links.producers.get(&op)) {
                    (Some(rk), _) => Q8GemvPlan::with_rope_kv(ctx, &QuantGemvQ8 { rope_kv: true, ..cfg }, w, xa, &y, rk),
                    (None, Some(l)) => {
                        let mut cfg = QuantGemvQ8 { epilogue: l.epilogue, ..cfg };
                        if let Some(s) = l.shape {
                            (cfg.rows_per_workgroup, cfg.threads, cfg.unroll, cfg.subgroup_rows, cfg.row_groups) =
                                (s.rows, s.threads, s.unroll, s.subgroup_rows, 1);
                        }
                        Q8GemvPlan::with_epilogue(ctx, &cfg, w, xa, &output, &l.target, l.norm.as_ref())
                    }
                    (None, None) => Q8GemvPlan::new(ctx, &cfg, w, xa, &output),
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
            (Mode::Prefill { max_tok } | Mode::Batch { max_tok }, _) if inp.prefill_gemv || inp.rows_only => {
                // Every row is a decode row (a verification step's few rows, a batched step's
                // decode lane); the f32 GEMV takes a fused norm or GLU as its prologue (the int8
                // one's quantizer took it).
                let accumulate = f.accumulate;
                let prologue = match (&f.norm, f.glu) {
                    (Some(n), _) => Some((Prologue::RmsNorm { gemma: false, stage_k: 0 }, Some(inp.weights.vec(n)?.binding.clone()))),
                    (None, Some(act)) => Some((Prologue::Glu { act }, None)),
                    (None, None) => None,
                };
                decode_rows_gemv(cx, plan, DecodeRows { xa: xa_batch.as_ref(), w, x: &x, output, eps, max_tok, accumulate, prologue })?;
            }
            (Mode::Batch { max_tok }, _) if !inp.batch_decode_gemv => {
                // Every row through the GEMM (a batch state of many sequences, where one GEMM
                // pass over the weights beats the GEMV's pass per group of decode rows).
                // Split over K where the row bands' grids are small (the same split in every
                // band, so a row's result does not depend on the step's rows), in the split
                // GEMM's bands either way.
                let cfg = QuantGemm { unchecked: true, x_f16: x_half.is_some(), ..QuantGemm::new(kind, ctx) };
                // (Decided at the slots' rows, as the partials' size is.)
                let rows = cx.slots.rows();
                let splits = if matches!(inp.graph.ops[op], Op::Linear { .. }) { batch_split_k(ctx, inp.tuning, w, rows) } else { 1 };
                let gemm = match (w.parts.len(), splits) {
                    (1, 1) => GemmPlan::with_split_k_sum(ctx, &cfg, w, &gemm_x, &gemm_x, &output, max_tok, 1),
                    // The next op adds the partials up: the RoPE op in the Q/K/V slot itself
                    // (sized for them), the residual add and norm from the plan's partials.
                    (1, splits) if splits == partial_sums => {
                        let partials = match inp.graph.ops[op] {
                            Op::Linear { out: Slot::Qkv, .. } => y.clone(),
                            _ => Binding::whole(cx.slots.partials(ctx, batch_split_row_elems(ctx, inp, rows))?),
                        };
                        GemmPlan::with_split_k_partials(ctx, &cfg, w, &gemm_x, &partials, max_tok, splits)
                    }
                    (1, splits) => {
                        let partials = Binding::whole(cx.slots.partials(ctx, batch_split_row_elems(ctx, inp, rows))?);
                        GemmPlan::with_split_k_sum(ctx, &cfg, w, &gemm_x, &partials, &output, max_tok, splits)
                    }
                    _ => GemmPlan::with_output(ctx, &cfg, w, &gemm_x, &output, max_tok),
                };
                plan.append(gemm.map_err(|e| quant_err(ctx, &w.name, e))?.plan());
            }
            (Mode::Batch { max_tok }, _) => {
                // The prompt rows through the GEMM (skipped in a step of decode rows only), then
                // the decode rows through the multi-row GEMV, which reads the weights once for
                // all of them: a row's kernel depends on what it is, not on the other rows.
                let cfg = QuantGemm { unchecked: true, x_f16: x_half.is_some(), ..QuantGemm::new(kind, ctx) };
                let gemm = GemmPlan::beside_decode_rows(ctx, &cfg, w, &gemm_x, &output, max_tok);
                plan.append(gemm.map_err(|e| quant_err(ctx, &w.name, e))?.plan());
                decode_rows_gemv(cx, plan, DecodeRows { xa: xa_batch.as_ref(), w, x: &x, output, eps, max_tok, accumulate: false, prologue: None })?;
            }
            (Mode::Prefill { max_tok }, _) => {
                let cfg = QuantGemm { unchecked: true, x_f16: x_half.is_some(), ..QuantGemm::new(kind, ctx) };
                let splits = qkv_split_k(ctx, inp, op, max_tok);
                let p = match splits {
                    1 => GemmPlan::with_output(ctx, &cfg, w, &gemm_x, &output, max_tok),
                    splits => GemmPlan::with_split_k(ctx, &cfg, w, &gemm_x, &y, max_tok, splits),
                };
                plan.append(p.map_err(|e| quant_err(ctx, &w.name, e))?.plan());
            }
        }
    }
    Ok(())
}

/// Where the op's GEMMs read f16 activations (a prefill or batched plan whose GEMMs run, with
/// `gemm_f16_input` on, or with `auto` where the coopmat GEMM runs): the rows of `x` rounded
/// to f16 into the plan's shared scratch ([`Slots::half`]) by a dispatch recorded here, skipped
/// with the GEMM in a batched step of decode rows only. `None`: the GEMMs read `x` (f32).
fn half_input(cx: &PlanCx, plan: &mut Plan, x: &Binding, k: usize, name: &str) -> Result<Option<Binding>, EngineError> {
    let (ctx, inp) = (cx.ctx, cx.inp);
    let gemv_rows = inp.prefill_gemv || inp.rows_only;
    let (max_tok, beside_decode) = match cx.mode {
        Mode::Prefill { max_tok } if !gemv_rows => (max_tok, false),
        Mode::Batch { max_tok } if !gemv_rows => (max_tok, inp.batch_decode_gemv),
        _ => return Ok(None),
    };
    let coop = QuantGemm::coopmat_available(ctx);
    if !inp.tuning.gemm_f16_input.unwrap_or(coop) || !ctx.capabilities().shader_f16 {
        return Ok(None);
    }
    let half = Binding::whole(cx.slots.half(ctx)?);
    let p = if beside_decode { HalfRowsPlan::beside_decode_rows(ctx, x, &half, max_tok, k) } else { HalfRowsPlan::new(ctx, x, &half, max_tok, k) };
    plan.append(p.map_err(|e| quant_err(ctx, name, e))?.plan());
    Ok(Some(half))
}

/// What [`decode_rows_gemv`] reads and writes.
struct DecodeRows<'a> {
    /// The step's rows quantized to int8 (the integer-dot GEMV), else `None` (the f32 one).
    xa: Option<&'a Q8Activations>,
    w: &'a QuantMatrix,
    x: &'a Binding,
    output: GemvOutput,
    eps: f32,
    max_tok: usize,
    /// `y += x Wᵀ` (the residual add of a verification plan, `fuse_rows`).
    accumulate: bool,
    /// The f32 GEMV's fused RMSNorm (with its weight) or GLU (a verification plan).
    prologue: Option<(Prologue, Option<Binding>)>,
}

/// The step's decode rows (`StepValues::decode_rows`) through the multi-row GEMV, which reads
/// the weights once per group of rows: integer-dot where the rows were quantized
/// ([`GpuTuning::batch_q8`](super::super::super::tuning::GpuTuning::batch_q8), `verify_q8`), else f32
/// (`batch_gemv`).
fn decode_rows_gemv(cx: &PlanCx, plan: &mut Plan, d: DecodeRows) -> Result<(), EngineError> {
    let (ctx, env, inp) = (cx.ctx, cx.env, cx.inp);
    let kind = WeightKind::of(d.w.format);
    match (d.xa, rows_q8(inp)) {
        (Some(xa), Some(t)) => {
            let base = QuantGemvQ8::new(kind, env, t.group);
            let cfg = QuantGemvQ8 {
                unchecked: true,
                step_rows: true,
                accumulate: d.accumulate,
                rows_per_workgroup: t.rows,
                threads: t.threads,
                unroll: t.unroll,
                ..base
            };
            let p = Q8GemvPlan::decode_rows(ctx, &cfg, d.w, xa, &d.output);
            plan.append(p.map_err(|e| quant_err(ctx, &d.w.name, e))?.plan());
        }
        _ => {
            let t = inp.tuning.batch_gemv;
            let base = QuantGemv::new(kind, env, t.group);
            let (prologue, norm_weight) = d.prologue.unwrap_or((Prologue::None, None));
            let gemv = QuantGemv {
                unchecked: true,
                step_rows: true,
                accumulate: d.accumulate,
                prologue,
                rows_per_workgroup: t.rows,
                threads: t.threads,
                f16_math: t.f16,
                ..base
            };
            let io = GemvIo { x: d.x.clone(), norm_weight, eps: d.eps, output: d.output };
            let p = GemvPlan::decode_rows(ctx, &gemv, d.w, &io, d.max_tok);
            plan.append(p.map_err(|e| quant_err(ctx, &d.w.name, e))?.plan());
        }
    }
    Ok(())
}

/// Whether linear op `op`'s decode GEMV can run the next op's RoPE and KV write (boostr's
/// `rope_kv` epilogue): one part of exactly the Q, K and V rows, an f16 cache of one segment per
/// layer, 8 storage bindings, and even rows per workgroup (and per subgroup) in its layout.
pub(in super::super) fn rope_fusable(ctx: &GpuContext, env: &KernelEnv, inp: &PlanInputs, op: usize) -> bool {
    let c = &inp.graph.cfg;
    let Ok(parts) = inp.weights.linear_parts(inp.graph, op) else { return false };
    let Some(cache) = inp.cache else { return false };
    let cc = cache.config();
    let one_segment = cache.segment_len() >= cache.capacity();
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

/// The shape of the plan's integer-dot multi-row GEMV: a verification step's
/// (`GpuTuning::verify_q8`) or a batched step's (`GpuTuning::batch_q8`); `None`: the f32 one.
fn rows_q8(inp: &PlanInputs) -> Option<super::super::super::tuning::BatchQ8> {
    if inp.prefill_gemv { inp.tuning.verify_q8 } else { inp.tuning.batch_q8 }
}

/// Whether the multi-row GEMV of linear op `op` (a batched step's decode rows, a verification
/// step's rows) is an integer-dot one: the int8 decode path on, its rows GEMV not turned off
/// ([`rows_q8`]), every part a quantized format.
pub(in super::super) fn rows_int8(inp: &PlanInputs, op: usize) -> bool {
    let Some(parts) = inp.weights.linear.get(&op) else { return false };
    rows_q8(inp).is_some() && inp.decode_gemv.int8_for(inp.graph.cfg.dim) && parts.iter().all(|p| QuantGemvQ8::supports(WeightKind::of(p.w.format)))
}

/// Whether linear op `op` runs as integer-dot GEMVs (decode, the int8 path, every part a
/// quantized format; false for an op without weights).
pub(in super::super) fn uses_int8(inp: &PlanInputs, op: usize, mode: Mode) -> bool {
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
