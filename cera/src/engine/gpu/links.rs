//! Which int8 GEMVs of the decode plan write the next projection's int8 activations themselves
//! (boostr's GEMV epilogues and the attention's quantized merge), replacing a quantizer dispatch.

use std::collections::HashMap;

use boostr::attention::DecodePlan;
use boostr::quant::{Q8Activations, Q8Epilogue, Q8GemvPlan};
use numr::gpu::{Binding, GpuContext, KernelEnv};

use super::super::EngineError;
use super::super::graph::{Op, Slot};
use super::super::tuning::WorkgroupShape;
use super::fuse::{Fusions, Input};
use super::plans::{Mode, PlanInputs, uses_int8};
use super::quant_err;
use super::tuning::{norm_local_shape, q8_config};

/// Which producers quantize the int8 GEMVs' activations ([`epilogue_links`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Epilogues {
    /// GEMV epilogues (the next norm's input, the GLU).
    pub(super) gemv: bool,
    /// The decode attention's merge (the output projection's input).
    pub(super) attention: bool,
}

/// A producing GEMV's epilogue: what it quantizes and for which op.
pub(super) struct Link {
    /// The consumer's int8 activations, which the producer writes.
    pub(super) target: Q8Activations,
    pub(super) epilogue: Q8Epilogue,
    /// The next RMSNorm's weight.
    pub(super) norm: Option<Binding>,
    /// The producer's workgroup shape with a workgroup-local epilogue (`GluLocal`,
    /// `QuantizeLocal`); `None`: its own configuration.
    pub(super) shape: Option<WorkgroupShape>,
}

/// Which int8 GEMVs quantize their own output for the next projection (boostr's
/// [`Q8Epilogue`]), replacing the quantizer dispatch before it: the consumers' scratch (written
/// by their producer) and the producers' links.
#[derive(Default)]
pub(crate) struct Links {
    pub(super) targets: HashMap<usize, Q8Activations>,
    pub(super) producers: HashMap<usize, Link>,
    /// Attention ops whose merge writes the next op's int8 activations (the consumer's).
    pub(super) attention: HashMap<usize, Q8Activations>,
}

/// The epilogue links of the decode plan. A consumer is an int8 linear op that reads
/// - the RMSNorm of the residual stream, when the op recorded before it is an int8 GEMV adding
///   into that stream (the O or down projection): that GEMV quantizes `h * w` per block and
///   the consumer applies `1 / rms` ([`Q8Epilogue::Quantize`]);
/// - the GLU of `[gate | up]`, when the op recorded before it is the int8 GEMV writing them
///   ([`Q8Epilogue::Glu`]);
/// - the attention output, when the op recorded before it is the decode attention, whose fused
///   merge then writes the int8 activations (boostr's `DecodePlanBuilder::quantized_output`).
///
/// The producer must be one part with a plain output, and the adapter must run epilogues
/// ([`Q8GemvPlan::epilogue_supported`]); anything else keeps its quantizer dispatch.
pub(super) fn epilogue_links(ctx: &GpuContext, env: &KernelEnv, inp: &PlanInputs, fused: &Fusions, allow: Epilogues) -> Result<Links, EngineError> {
    let (g, mode) = (inp.graph, Mode::Decode);
    let mut links = Links::default();
    for (i, op) in g.ops.iter().enumerate() {
        let f = &fused.ops[i];
        if f.skip || !matches!(op, Op::Linear { .. } | Op::LmHead { .. }) || !uses_int8(inp, i, mode) {
            continue;
        }
        // The op recorded just before this one.
        let Some(p) = (0..i).rev().find(|&j| !fused.ops[j].skip) else { continue };
        let k = inp.weights.linear.get(&i).and_then(|v| v.first()).map_or(0, |q| q.w.cols);
        if let (Op::Attention { layer, .. }, Op::Linear { x: Slot::Attn, .. }, Input::Plain) = (&g.ops[p], op, &f.input) {
            // The attention's merge writes the output projection's int8 activations.
            let c = &g.cfg;
            // The portable kernel (other head sizes and groups) writes f32 only.
            let tuned = boostr::attention::contiguous_supported(c.head_dim, c.n_heads / c.n_kv_heads.max(1));
            if allow.attention && tuned && inp.cache.is_some_and(|cache| DecodePlan::quantized_output_supported(ctx, cache, *layer)) && k == g.width(Slot::Attn)
            {
                let target = Q8Activations::written_by_producer(ctx, k, None).map_err(|e| quant_err(ctx, "attention output", e))?;
                links.targets.insert(i, target.clone());
                links.attention.insert(p, target);
            }
            continue;
        }
        let Op::Linear { out: p_out, .. } = &g.ops[p] else { continue };
        if !allow.gemv {
            continue;
        }
        let parts = inp.weights.linear_parts(g, p)?;
        if !uses_int8(inp, p, mode) || parts.len() != 1 || parts[0].w.rows != g.width(*p_out) || links.producers.contains_key(&p) {
            continue;
        }
        let w = &parts[0].w;
        // Workgroups that own whole blocks where the shape fits the matrix and the adapter (its
        // invocations per workgroup; rows per subgroup need subgroups).
        let max_inv = ctx.capabilities().limits.max_compute_invocations_per_workgroup;
        let fits = |block: u32, s: &WorkgroupShape| {
            let (r, t) = (s.rows, s.threads);
            r.is_multiple_of(block)
                && w.rows.is_multiple_of(r as usize)
                && t >= Q8Epilogue::QUANT_LANES.max(r)
                && t <= max_inv
                && (s.subgroup_rows == 0 || env.subgroups)
        };
        let (epilogue, norm, deferred, shape) = match &f.input {
            Input::Norm(n) if fused.ops[p].accumulate && w.rows == k => {
                let shape = norm_local_shape(inp.tuning, w.cols).filter(|s| fits(32, s));
                let epilogue =
                    if shape.is_some() { Q8Epilogue::QuantizeLocal { norm: true, gemma: false } } else { Q8Epilogue::Quantize { norm: true, gemma: false } };
                (epilogue, Some(inp.weights.vec(n)?.binding.clone()), Some(g.cfg.norm_eps), shape)
            }
            Input::Glu(act, src) if src == p_out && !fused.ops[p].accumulate && w.rows == 2 * k => {
                let shape = inp.tuning.glu_local.filter(|s| fits(64, s));
                (if shape.is_some() { Q8Epilogue::GluLocal { act: *act } } else { Q8Epilogue::Glu { act: *act } }, None, None, shape)
            }
            _ => continue,
        };
        let q8 = q8_config(inp.tuning, env, w);
        let arrivals_fit = 32u32.is_multiple_of(q8.rows_per_workgroup) && q8.threads >= Q8Epilogue::QUANT_LANES;
        if !Q8GemvPlan::epilogue_supported(ctx, epilogue)
            || (epilogue.uses_arrivals() && !arrivals_fit)
            || !w.rows.is_multiple_of(epilogue.block_rows() as usize)
        {
            continue;
        }
        let target = Q8Activations::written_by_producer(ctx, k, deferred).map_err(|e| quant_err(ctx, &w.name, e))?;
        links.targets.insert(i, target.clone());
        links.producers.insert(p, Link { target, epilogue, norm, shape });
    }
    Ok(links)
}
