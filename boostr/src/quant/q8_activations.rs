//! The int8 activations of the integer-dot GEMV ([`super::gemv_q8`]): per block of 32,
//! `d = max|x| / 127`, `q = round(x / d)` (ties away from zero, as llama.cpp) packed four per word (`xq`, two `vec4<u32>` per block)
//! and `vec4(d, d * sum(q[0..16]), d * sum(q[16..32]), 0)` (`xs`).
//!
//! - [`QuantizeQ8`]: quantizes `x` as it is (one invocation per block, 64 per workgroup).
//! - [`RmsNormQuantizeQ8`]: the fused RMSNorm + quantize: one workgroup per activation row
//!   reduces `sum(x^2)`, then quantizes `x / sqrt(mean(x^2) + eps) * w` (or `* (1 + w)`,
//!   Gemma's form). One dispatch replaces the norm and the quantization, and every projection
//!   that reads the normalised activations (Q/K/V, gate/up) shares its output.
//!
//! [`Q8Activations`] owns the scratch and records either kernel.

use std::sync::Arc;

use numr::gpu::{Access, Binding, BoundGroup, BufferKind, GpuBuffer, GpuContext, Kernel, KernelBuilder, KernelEnv, KernelSource, Recorder, grid_2d};

use numr::kernels::reduce::{reduce_args, workgroup_reduce_fns};

use super::{QuantError, Result};

/// WGSL: `fn quant_block(v, b)` writes block `b` of `xq`/`xs` from its 32 values (rounding ties
/// away from zero, as llama.cpp's `roundf`).
const QUANT_BLOCK: &str = "fn round_away4(t: vec4<f32>) -> vec4<f32> {
    let tr = trunc(t);
    return select(round(t), tr + sign(t), abs(t - tr) == vec4<f32>(0.5));
}
fn quant_block(v: array<vec4<f32>, 8>, b: u32) {
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
    xs[b] = vec4<f32>(d, d * f32(lo), d * f32(hi), 0.0);
}
";

/// The activation quantizer (one kernel for every shape; 64 blocks per workgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantizeQ8;

impl QuantizeQ8 {
    pub const BLOCKS_PER_WORKGROUP: u32 = 64;

    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("quantize_q8_x", *env)
            .workgroup(Self::BLOCKS_PER_WORKGROUP, 1, 1)
            .storage("x", Access::Read, "array<vec4<f32>>")
            .storage("xq", Access::ReadWrite, "array<vec4<u32>>")
            .storage("xs", Access::ReadWrite, "array<vec4<f32>>")
            .params(&["nb"])
            .prelude(QUANT_BLOCK)
            .body(
                "    let b = wg_linear * 64u + lidx;
    if (b >= p.nb) { return; }
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) { v[i] = x[b * 8u + i]; }
    quant_block(v, b);
",
            )
            .build()
    }
}

/// The fused RMSNorm + quantizer: one workgroup of [`RmsNormQuantizeQ8::THREADS`] per
/// activation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RmsNormQuantizeQ8 {
    /// Scale by `1 + w` (Gemma) instead of `w`.
    pub gemma: bool,
}

impl RmsNormQuantizeQ8 {
    pub const THREADS: u32 = 256;

    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let scale = if self.gemma { "(vec4<f32>(1.0) + nw[kb * 8u + i])" } else { "nw[kb * 8u + i]" };
        let args = reduce_args(env);
        let body = format!(
            "    let row = wg_linear;
    let base = row * p.k4;
    var ss = 0.0;
    for (var i = lidx; i < p.k4; i += 256u) {{ let v = x[base + i]; ss += dot(v, v); }}
    let inv = inverseSqrt(wg_sum(ss, {args}) / f32(p.k4 * 4u) + bitcast<f32>(p.eps));
    let nb = p.k4 / 8u;
    for (var kb = lidx; kb < nb; kb += 256u) {{
        var v: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {{ v[i] = x[base + kb * 8u + i] * inv * {scale}; }}
        quant_block(v, row * nb + kb);
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
            .params(&["k4", "eps"])
            .prelude(&format!("{}{QUANT_BLOCK}", workgroup_reduce_fns(env)))
            .body(&body)
            .build()
    }
}

/// The quantized activations of `m` rows of `k` inputs (scratch of a
/// [`super::Q8GemvPlan`]; can be shared by several plans that read the same activations).
pub struct Q8Activations {
    pub xq: Arc<GpuBuffer>,
    pub xs: Arc<GpuBuffer>,
    kernel: Arc<Kernel>,
    group: BoundGroup,
    params: Vec<u32>,
    grid: [u32; 3],
    pub(crate) nb: u32,
}

impl Q8Activations {
    fn scratch(ctx: &GpuContext, m: usize, k: usize) -> Result<(Arc<GpuBuffer>, Arc<GpuBuffer>, usize)> {
        if k % 32 != 0 || k == 0 || m == 0 {
            return Err(QuantError::Shape { what: "quantize_q8", reason: format!("{m} x {k} (k must be a positive multiple of 32)") });
        }
        let nb = m * k / 32;
        Ok((ctx.alloc(nb as u64 * 32, BufferKind::Storage)?, ctx.alloc(nb as u64 * 16, BufferKind::Storage)?, nb))
    }

    /// Scratch for `m x k` activations read from `x` (f32, `k % 32 == 0`), quantized as they are.
    pub fn new(ctx: &GpuContext, x: &Arc<GpuBuffer>, m: usize, k: usize) -> Result<Q8Activations> {
        let (xq, xs, nb) = Self::scratch(ctx, m, k)?;
        let env = KernelEnv::from_caps(ctx.capabilities());
        let kernel = ctx.kernel(&QuantizeQ8.source(&env))?;
        let group = ctx.bind(&kernel, &[Binding { buffer: x.clone(), offset: 0, size: nb as u64 * 128 }, Binding::whole(&xq), Binding::whole(&xs)])?;
        let wgs = (nb as u64).div_ceil(QuantizeQ8::BLOCKS_PER_WORKGROUP as u64);
        let grid = grid_2d(wgs, ctx.capabilities().limits.max_compute_workgroups_per_dimension)
            .ok_or(QuantError::Shape { what: "quantize_q8", reason: format!("{wgs} workgroups") })?;
        Ok(Q8Activations { xq, xs, kernel, group, params: vec![nb as u32], grid, nb: nb as u32 })
    }

    /// Scratch for the RMSNorm of `m x k` activations `x` with weight `norm_weight` (`k` f32),
    /// quantized in the same dispatch.
    pub fn with_rms_norm(
        ctx: &GpuContext,
        x: &Arc<GpuBuffer>,
        norm_weight: &Arc<GpuBuffer>,
        m: usize,
        k: usize,
        eps: f32,
        gemma: bool,
    ) -> Result<Q8Activations> {
        let (xq, xs, nb) = Self::scratch(ctx, m, k)?;
        let env = KernelEnv::from_caps(ctx.capabilities());
        let kernel = ctx.kernel(&RmsNormQuantizeQ8 { gemma }.source(&env))?;
        let bind = [
            Binding { buffer: x.clone(), offset: 0, size: (m * k * 4) as u64 },
            Binding { buffer: norm_weight.clone(), offset: 0, size: (k * 4) as u64 },
            Binding::whole(&xq),
            Binding::whole(&xs),
        ];
        let group = ctx.bind(&kernel, &bind)?;
        let grid = grid_2d(m as u64, ctx.capabilities().limits.max_compute_workgroups_per_dimension)
            .ok_or(QuantError::Shape { what: "rmsnorm_quantize_q8", reason: format!("{m} rows") })?;
        Ok(Q8Activations { xq, xs, kernel, group, params: vec![(k / 4) as u32, eps.to_bits()], grid, nb: nb as u32 })
    }

    /// Records the quantization dispatch.
    pub fn record(&self, rec: &mut Recorder) -> Result<()> {
        rec.dispatch(&self.kernel, &self.group, &self.params, self.grid)?;
        Ok(())
    }
}
