//! The int8 activations of the integer-dot GEMV ([`super::gemv_q8`]): per block of 32,
//! `d = max|x| / 127`, `q = round(x / d)` (ties away from zero, as llama.cpp) packed four per word (`xq`, two `vec4<u32>` per block)
//! and `vec4(d, d * sum(q[0..16]), d * sum(q[16..32]), 0)` (`xs`).
//!
//! - [`QuantizeQ8`]: quantizes `x` as it is (one invocation per block, 64 per workgroup).
//! - [`GluQuantizeQ8`]: quantizes `act(gate) * up` of packed `[gate | up]` rows (the input of
//!   an FFN's down projection; the GLU and the quantization in one dispatch).
//! - [`RmsNormQuantizeQ8`]: the fused RMSNorm + quantize: one workgroup per activation row
//!   reduces `sum(x^2)`, then quantizes `x / sqrt(mean(x^2) + eps) * w` (or `* (1 + w)`,
//!   Gemma's form). One dispatch replaces the norm and the quantization, and every projection
//!   that reads the normalised activations (Q/K/V, gate/up) shares its output.
//!
//! [`Q8Activations`] owns the scratch and records either kernel, for `step.n_tok` rows of at most
//! the rows it was built for.
//!
//! Both kernels are compiled with naga's bounds checks (they are a small part of a decode step).

use std::sync::Arc;

use numr::gpu::{
    Access, Binding, BufferKind, GpuBuffer, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, Recorder, StepValues, grid_2d,
};

use numr::kernels::reduce::{reduce_args, workgroup_reduce_fns};

use super::kernel_common::grid_for;
use super::validate::{check_binding, check_step, mul, step_rows, to_u32};
use super::{QuantError, Result};

/// WGSL: `fn quant_block(v, b, ss)` writes block `b` of `xq`/`xs` from its 32 values (rounding
/// ties away from zero, as llama.cpp's `roundf`), with `ss` in the scale's fourth word.
pub(crate) const QUANT_BLOCK: &str = "fn round_away4(t: vec4<f32>) -> vec4<f32> {
    let tr = trunc(t);
    return select(round(t), tr + sign(t), abs(t - tr) == vec4<f32>(0.5));
}
fn quant_block(v: array<vec4<f32>, 8>, b: u32, ss: f32) {
    var amax = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) { amax = max(amax, abs(v[i])); }
    let am = max(max(amax.x, amax.y), max(amax.z, amax.w));
    let inv = select(0.0, 127.0 / am, am > 0.0);
    var w: array<u32, 8>;
    var lo = 0i;
    var hi = 0i;
    for (var i = 0u; i < 8u; i++) {
        let q = vec4<i32>(round_away4(v[i] * inv));
        w[i] = pack4xI8(q);
        let s = q.x + q.y + q.z + q.w;
        if (i < 4u) { lo += s; } else { hi += s; }
    }
    xq[b * 2u] = vec4<u32>(w[0], w[1], w[2], w[3]);
    xq[b * 2u + 1u] = vec4<u32>(w[4], w[5], w[6], w[7]);
    let d = am / 127.0;
    xs[b] = vec4<f32>(d, d * f32(lo), d * f32(hi), ss);
}
";

/// The activation quantizer (one kernel for every shape; 64 blocks per workgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantizeQ8;

impl QuantizeQ8 {
    /// Blocks of 32 activations per workgroup (one invocation each).
    pub const BLOCKS_PER_WORKGROUP: u32 = 64;

    /// WGSL. Bindings `x` (read, `vec4<f32>`), `xq` and `xs` (written, see the module docs);
    /// params `nb` (blocks in all) and `k4` (unused here).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("quantize_q8_x", *env)
            .workgroup(Self::BLOCKS_PER_WORKGROUP, 1, 1)
            .storage("x", Access::Read, "array<vec4<f32>>")
            .storage("xq", Access::ReadWrite, "array<vec4<u32>>")
            .storage("xs", Access::ReadWrite, "array<vec4<f32>>")
            // `k4` is unused here; the GLU quantizer shares the plan builder that sets it.
            .params(&["nb", "k4"])
            .prelude(QUANT_BLOCK)
            .body(
                "    let b = wg_linear * 64u + lidx;
    if (b >= p.nb) { return; }
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) { v[i] = x[b * 8u + i]; }
    quant_block(v, b, 0.0);
",
            )
            .build()
    }
}

/// The fused GLU + quantizer: block `b` of row `r` quantizes `act(gate) * up` of the packed
/// `[gate | up]` row `r` (`2 k` f32), one invocation per block, 64 per workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GluQuantizeQ8 {
    /// The gate's nonlinearity.
    pub act: crate::act::ActKind,
}

impl GluQuantizeQ8 {
    /// WGSL. Bindings `x` (read, packed `[gate | up]` rows), `xq`, `xs` (written); params `nb`
    /// (output blocks in all) and `k4` (`k / 4`, the output row length in vec4s).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new(format!("glu_quantize_q8_{}", self.act.name()), *env)
            .workgroup(QuantizeQ8::BLOCKS_PER_WORKGROUP, 1, 1)
            .storage("x", Access::Read, "array<vec4<f32>>")
            .storage("xq", Access::ReadWrite, "array<vec4<u32>>")
            .storage("xs", Access::ReadWrite, "array<vec4<f32>>")
            .params(&["nb", "k4"])
            .prelude(&format!("{}{}{QUANT_BLOCK}", crate::ops_common::SAFE_TANH, self.act.wgsl()))
            .body(
                "    let b = wg_linear * 64u + lidx;
    if (b >= p.nb) { return; }
    let bpr = p.k4 / 8u;
    let row = b / bpr;
    let g0 = row * 2u * p.k4 + (b % bpr) * 8u;
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        let g = x[g0 + i];
        v[i] = vec4<f32>(act(g.x), act(g.y), act(g.z), act(g.w)) * x[g0 + p.k4 + i];
    }
    quant_block(v, b, 0.0);
",
            )
            .build()
    }
}

/// The fused RMSNorm + quantizer: one workgroup of [`RmsNormQuantizeQ8::THREADS`] per
/// activation row (`p.rows` rows; workgroups past them return at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RmsNormQuantizeQ8 {
    /// Scale by `1 + w` (Gemma) instead of `w`.
    pub gemma: bool,
}

impl RmsNormQuantizeQ8 {
    /// Invocations per workgroup (one workgroup per activation row).
    pub const THREADS: u32 = 256;

    /// WGSL. Bindings `x` (read, rows of `4 * k4` f32), `nw` (read, the norm weight), `xq`, `xs`
    /// (written); params `k4`, `eps` (f32 bits) and `rows`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let scale = if self.gemma { "(vec4<f32>(1.0) + nw[kb * 8u + i])" } else { "nw[kb * 8u + i]" };
        let args = reduce_args(env);
        let body = format!(
            "    let row = wg_linear;
    if (row >= p.rows) {{ return; }}
    let base = row * p.k4;
    var ss = 0.0;
    for (var i = lidx; i < p.k4; i += 256u) {{ let v = x[base + i]; ss += dot(v, v); }}
    let inv = inverseSqrt(wg_sum(ss, {args}) / f32(p.k4 * 4u) + bitcast<f32>(p.eps));
    let nb = p.k4 / 8u;
    for (var kb = lidx; kb < nb; kb += 256u) {{
        var v: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {{ v[i] = x[base + kb * 8u + i] * inv * {scale}; }}
        quant_block(v, row * nb + kb, 0.0);
    }}
"
        );
        KernelBuilder::new(format!("rmsnorm_quantize_q8{}", if self.gemma { "_gemma" } else { "" }), *env)
            .workgroup(Self::THREADS, 1, 1)
            .subgroup_builtins()
            .storage("x", Access::Read, "array<vec4<f32>>")
            .storage("nw", Access::Read, "array<vec4<f32>>")
            .storage("xq", Access::ReadWrite, "array<vec4<u32>>")
            .storage("xs", Access::ReadWrite, "array<vec4<f32>>")
            .params(&["k4", "eps", "rows"])
            .prelude(&format!("{}{QUANT_BLOCK}", workgroup_reduce_fns(env)))
            .body(&body)
            .build()
    }
}

/// The RMSNorm quantizer whose `1 / rms` the consuming GEMV applies
/// ([`super::QuantGemvQ8::rms_scale`]): block `b` quantizes `x * w` (or `x * (1 + w)`) and
/// stores `sum(x^2)` of its 32 raw values in `xs[b].w`, one invocation per block, 64 per
/// workgroup. The codes of `x * w * inv_rms` and of `x * w` are the same (the block's scale
/// `max|x w| / 127` carries the common factor `inv_rms`), so the row's reduction moves into
/// the consumer, which sums the blocks' `xs.w`; no workgroup reduces a whole row here. A GEMV's
/// epilogue ([`super::Q8Epilogue::Quantize`]) writes the same activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeferredRmsQuantizeQ8 {
    /// Scale by `1 + w` (Gemma) instead of `w`.
    pub gemma: bool,
}

impl DeferredRmsQuantizeQ8 {
    /// WGSL. Bindings `x` (read, `vec4<f32>`), `nw` (read, the norm weight, `k` f32), `xq`,
    /// `xs` (written); params `nb` (blocks in all) and `k4` (`k / 4`).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let scale = if self.gemma { "(vec4<f32>(1.0) + nw[c + i])" } else { "nw[c + i]" };
        KernelBuilder::new(format!("deferred_rms_quantize_q8{}", if self.gemma { "_gemma" } else { "" }), *env)
            .workgroup(QuantizeQ8::BLOCKS_PER_WORKGROUP, 1, 1)
            .storage("x", Access::Read, "array<vec4<f32>>")
            .storage("nw", Access::Read, "array<vec4<f32>>")
            .storage("xq", Access::ReadWrite, "array<vec4<u32>>")
            .storage("xs", Access::ReadWrite, "array<vec4<f32>>")
            .params(&["nb", "k4"])
            .prelude(QUANT_BLOCK)
            .body(&format!(
                "    let b = wg_linear * 64u + lidx;
    if (b >= p.nb) {{ return; }}
    // The block's first vec4 within its row (the norm weight's index).
    let c = (b % (p.k4 / 8u)) * 8u;
    var v: array<vec4<f32>, 8>;
    var ss = 0.0;
    for (var i = 0u; i < 8u; i++) {{
        let xv = x[b * 8u + i];
        ss += dot(xv, xv);
        v[i] = xv * {scale};
    }}
    quant_block(v, b, ss);
"
            ))
            .build()
    }
}

/// The int8 activations of up to `max_rows` rows of `k` inputs, with the plan that writes them
/// (quantize, or RMSNorm + quantize) from f32 activations `x`: the scratch of a
/// [`super::Q8GemvPlan`], shared by every plan that reads the same activations.
///
/// A recording for `step` quantizes rows `0..step.n_tok` (a step of more than `max_rows` tokens
/// is [`QuantError::StepTooLarge`]; a step of none records nothing).
#[derive(Clone, Debug)]
pub struct Q8Activations {
    xq: Arc<GpuBuffer>,
    xs: Arc<GpuBuffer>,
    plan: Plan,
    max_rows: usize,
    k: usize,
    /// The RMSNorm's `1 / rms` is left to the consumer (`xs.w` holds each block's `sum(x^2)`),
    /// with this epsilon.
    deferred_rms: Option<f32>,
}

impl Q8Activations {
    /// Checks the shape and `x` (`max_rows * k * x_per_elem` f32) and allocates the scratch.
    fn scratch(
        ctx: &GpuContext,
        op: &'static str,
        x: &Binding,
        max_rows: usize,
        k: usize,
        x_per_elem: usize,
    ) -> Result<(Arc<GpuBuffer>, Arc<GpuBuffer>, usize)> {
        if !k.is_multiple_of(32) || k == 0 || max_rows == 0 {
            return Err(QuantError::Shape { what: op, reason: format!("{max_rows} x {k} (k must be a positive multiple of 32, rows at least 1)") });
        }
        let elems = mul("activation elements", max_rows, k)?;
        check_binding(op, "x", x, mul("x elements", elems, x_per_elem)?, 4)?;
        let nb = elems / 32;
        let (xq, xs) = Self::alloc_blocks(ctx, nb)?;
        Ok((xq, xs, nb))
    }

    /// The `xq` / `xs` buffers of `nb` blocks: two vec4 words per block (32 bytes) and one vec4
    /// (16 bytes), every index within u32.
    fn alloc_blocks(ctx: &GpuContext, nb: usize) -> Result<(Arc<GpuBuffer>, Arc<GpuBuffer>)> {
        to_u32("xq words", mul("xq words", nb, 8)?)?;
        Ok((ctx.alloc(nb as u64 * 32, BufferKind::Storage)?, ctx.alloc(nb as u64 * 16, BufferKind::Storage)?))
    }

    /// Scratch for up to `max_rows x k` activations read from `x` (f32, `k % 32 == 0`),
    /// quantized as they are.
    pub fn new(ctx: &GpuContext, x: &Binding, max_rows: usize, k: usize) -> Result<Q8Activations> {
        let env = KernelEnv::from_caps(ctx.capabilities());
        Self::per_block(ctx, "quantize_q8", &QuantizeQ8.source(&env), x, None, max_rows, k, 1)
    }

    /// Scratch for the GLU of up to `max_rows` packed `[gate | up]` rows of `x` (`2 k` f32
    /// each): `act(gate) * up` quantized in one dispatch (the input of a down projection).
    pub fn with_glu(ctx: &GpuContext, x: &Binding, act: crate::act::ActKind, max_rows: usize, k: usize) -> Result<Q8Activations> {
        let env = KernelEnv::from_caps(ctx.capabilities());
        Self::per_block(ctx, "glu_quantize_q8", &GluQuantizeQ8 { act }.source(&env), x, None, max_rows, k, 2)
    }

    /// A one-invocation-per-block quantizer (`nb` blocks of the step, `k4` set) reading
    /// `x_per_elem` f32 of `x` per activation, and a norm weight (`k` f32, bound after `x`)
    /// when `norm` gives its epsilon: the activations then defer that RMSNorm.
    #[allow(clippy::too_many_arguments)]
    fn per_block(
        ctx: &GpuContext,
        op: &'static str,
        src: &KernelSource,
        x: &Binding,
        norm: Option<(&Binding, f32)>,
        max_rows: usize,
        k: usize,
        x_per_elem: usize,
    ) -> Result<Q8Activations> {
        let (xq, xs, nb) = Self::scratch(ctx, op, x, max_rows, k, x_per_elem)?;
        let mut bind = vec![x.clone()];
        if let Some((w, _)) = norm {
            check_binding(op, "norm weight", w, k, 4)?;
            bind.push(w.clone());
        }
        bind.extend([Binding::whole(&xq), Binding::whole(&xs)]);
        let kernel = ctx.kernel(src)?;
        let (bpr, wpg) = (to_u32("blocks per row", k / 32)?, QuantizeQ8::BLOCKS_PER_WORKGROUP);
        let max = to_u32("activation rows", max_rows)?;
        // The grid of the largest step must fit; smaller ones then do too.
        grid_for(ctx, nb.div_ceil(wpg as usize))?;
        let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let group = ctx.bind(&kernel, &bind)?;
        let d = PlanDispatch::new(&kernel, group, [0, 1, 1])?
            .set_usize("k4", k / 4)?
            .per_step("nb", move |s| step_rows(s, max) * bpr)?
            .grid_per_step(move |s| grid_2d((step_rows(s, max) * bpr).div_ceil(wpg) as u64, limit).unwrap_or([0, 0, 0]));
        Ok(Q8Activations { xq, xs, plan: Plan::from(d), max_rows, k, deferred_rms: norm.map(|(_, eps)| eps) })
    }

    /// Scratch for the RMSNorm of up to `max_rows x k` activations `x` with weight
    /// `norm_weight` (`k` f32), quantized in the same dispatch; `gemma` scales by `1 + w`.
    pub fn with_rms_norm(ctx: &GpuContext, x: &Binding, norm_weight: &Binding, max_rows: usize, k: usize, eps: f32, gemma: bool) -> Result<Q8Activations> {
        const OP: &str = "rmsnorm_quantize_q8";
        let (xq, xs, _) = Self::scratch(ctx, OP, x, max_rows, k, 1)?;
        check_binding(OP, "norm weight", norm_weight, k, 4)?;
        let env = KernelEnv::from_caps(ctx.capabilities());
        let kernel = ctx.kernel(&RmsNormQuantizeQ8 { gemma }.source(&env))?;
        let max = to_u32("activation rows", max_rows)?;
        grid_for(ctx, max_rows)?;
        let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let group = ctx.bind(&kernel, &[x.clone(), norm_weight.clone(), Binding::whole(&xq), Binding::whole(&xs)])?;
        let d = PlanDispatch::new(&kernel, group, [0, 1, 1])?
            .set_usize("k4", k / 4)?
            .set_f32("eps", eps)?
            .per_step("rows", move |s| step_rows(s, max))?
            .grid_per_step(move |s| grid_2d(step_rows(s, max) as u64, limit).unwrap_or([0, 0, 0]));
        Ok(Q8Activations { xq, xs, plan: Plan::from(d), max_rows, k, deferred_rms: None })
    }

    /// Scratch for the RMSNorm of up to `max_rows x k` activations `x` with weight
    /// `norm_weight` whose `1 / rms` the consuming GEMV applies ([`DeferredRmsQuantizeQ8`]; read
    /// it with [`super::QuantGemvQ8::rms_scale`] set): one invocation per block, no row
    /// reduction.
    pub fn with_deferred_rms_norm(
        ctx: &GpuContext,
        x: &Binding,
        norm_weight: &Binding,
        max_rows: usize,
        k: usize,
        eps: f32,
        gemma: bool,
    ) -> Result<Q8Activations> {
        let env = KernelEnv::from_caps(ctx.capabilities());
        Self::per_block(ctx, "deferred_rms_quantize_q8", &DeferredRmsQuantizeQ8 { gemma }.source(&env), x, Some((norm_weight, eps)), max_rows, k, 1)
    }

    /// Scratch for one row of `k` activations that another plan writes: a GEMV's epilogue
    /// ([`super::Q8Epilogue`]), which quantizes its own output for the next projection. With
    /// `deferred_rms` (an epsilon) the writer leaves the RMSNorm's `1 / rms` to the consumer
    /// ([`DeferredRmsQuantizeQ8`]). Its own plan is empty.
    pub fn written_by_producer(ctx: &GpuContext, k: usize, deferred_rms: Option<f32>) -> Result<Q8Activations> {
        const OP: &str = "q8_epilogue_target";
        if !k.is_multiple_of(32) || k == 0 {
            return Err(QuantError::Shape { what: OP, reason: format!("1 x {k} (k must be a positive multiple of 32)") });
        }
        let (xq, xs) = Self::alloc_blocks(ctx, k / 32)?;
        Ok(Q8Activations { xq, xs, plan: Plan::new(), max_rows: 1, k, deferred_rms })
    }

    /// The epsilon of an RMSNorm whose `1 / rms` the consumer applies (`None`: the activations
    /// are final).
    pub fn deferred_rms(&self) -> Option<f32> {
        self.deferred_rms
    }

    /// The int8 quants: two `vec4<u32>` per block of 32, blocks row-major (`rows x k / 32`).
    pub fn xq(&self) -> &Arc<GpuBuffer> {
        &self.xq
    }

    /// Per block `vec4(d, d * sum(q[0..16]), d * sum(q[16..32]), 0)`.
    pub fn xs(&self) -> &Arc<GpuBuffer> {
        &self.xs
    }

    pub(crate) fn xq_binding(&self) -> Binding {
        Binding::whole(&self.xq)
    }

    pub(crate) fn xs_binding(&self) -> Binding {
        Binding::whole(&self.xs)
    }

    /// The most rows a step may quantize.
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Inputs per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The dispatch, for an engine to append to its own plan (its row count is `step.n_tok`,
    /// clamped to [`Q8Activations::max_rows`]).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Records the quantization of `step.n_tok` rows.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        check_step("quantize_q8", step, self.max_rows)?;
        Ok(self.plan.record(rec, step)?)
    }

    /// Records into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &GpuContext, step: &StepValues) -> Result<()> {
        check_step("quantize_q8", step, self.max_rows)?;
        Ok(self.plan.run(ctx, step)?)
    }
}
