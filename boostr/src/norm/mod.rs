//! RMSNorm (with Gemma's `1 + weight` option) and LayerNorm over rows of f32, optionally fused
//! with the residual add: `h = x + residual; residual = h; out = norm(h) * w (+ b)`.
//!
//! One workgroup of 256 invocations per row, loading `vec4`s where the row length and every
//! offset allow ([`Norm::source_vec`]); the sums use subgroup reductions where the adapter
//! has them, else workgroup memory (numr's `workgroup_reduce_fns`). The mean and variance are
//! two passes over the row (no `E[x²] - E[x]²` cancellation).
//!
//! [`NormPlan`] is the op built once (kernel, bind group, output) and recorded per step: rows =
//! `step.n_tok`. [`Norm::run`] is the eager path over tensors, built on the same plan.

mod plan;

pub use plan::{NormIo, NormPlan};

use crate::ops_common::OpPlan;
use numr::gpu::{Access, GpuContext, KernelBuilder, KernelEnv, KernelSource, StepValues};
use numr::kernels::reduce::{reduce_args, workgroup_reduce_fns};
use numr::{DType, Tensor};

use crate::ops_common::{Result, bad, tensor_view, to_u32};

/// Which normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormKind {
    /// `x / sqrt(mean(x²) + eps)`.
    Rms,
    /// `(x - mean) / sqrt(var + eps)`.
    Layer,
}

/// A norm kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Norm {
    /// RMSNorm or LayerNorm.
    pub kind: NormKind,
    /// Multiply by `1 + w` instead of `w` (Gemma's RMSNorm).
    pub weight_offset: bool,
    /// Add a bias after the weight (LayerNorm with bias).
    pub bias: bool,
    /// Fused residual add: the residual buffer is updated in place to `x + residual` and that
    /// sum is normalised.
    pub residual: bool,
}

/// The kernels' params; the last two only in [`Norm::source_partials`].
const PARAMS: [&str; 13] = ["rows", "n", "eps", "x_off", "x_stride", "res_off", "res_stride", "out_off", "out_stride", "w_off", "b_off", "parts", "split_off"];

impl Norm {
    /// Plain RMSNorm: weight `w`, no bias, no residual.
    pub const fn rms() -> Norm {
        Norm { kind: NormKind::Rms, weight_offset: false, bias: false, residual: false }
    }

    /// Every variant (for validation).
    pub fn all() -> Vec<Norm> {
        let mut v = Vec::new();
        for kind in [NormKind::Rms, NormKind::Layer] {
            for weight_offset in [false, true] {
                for bias in [false, true] {
                    for residual in [false, true] {
                        v.push(Norm { kind, weight_offset, bias, residual });
                    }
                }
            }
        }
        v
    }

    /// WGSL over scalars ([`Norm::source_vec`] with `vec4 = false`).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        self.source_vec(env, false)
    }

    /// WGSL. Bindings: `x`, `w`, `b`, `res` (read-write), `out`; params `rows, n, eps, x_off,
    /// x_stride, res_off, res_stride, out_off, out_stride, w_off, b_off`. With `vec4` every
    /// binding is an array of `vec4<f32>` and `n`, the offsets and the strides count `vec4`s (a
    /// quarter of the loads and instructions; [`NormPlan`] takes it when the row length and every
    /// offset are multiples of 4).
    ///
    /// Bounds: workgroup `row < rows` reads `x[x_off + row * x_stride + i]`, `res[res_off + row *
    /// res_stride + i]` and writes `out[out_off + row * out_stride + i]` for `i < n`, and reads
    /// `w[w_off + i]`, `b[b_off + i]`; [`NormPlan::new`] checks every binding holds its extent.
    pub fn source_vec(&self, env: &KernelEnv, vec4: bool) -> KernelSource {
        self.source_with(env, vec4, false)
    }

    /// [`Norm::source_vec`] of a residual variant whose `x` is partial sums (a GEMM split over
    /// K): row `row`'s input is `x[xb + i] + x[split_off + xb + i] + ...` over `parts` partials,
    /// added in that order (as [`crate::quant::SplitSumPlan`] adds them) before the residual
    /// add. Extra params `parts, split_off`; [`NormPlan::with_partials`] builds it.
    pub fn source_partials(&self, env: &KernelEnv, vec4: bool) -> KernelSource {
        self.source_with(env, vec4, true)
    }

    fn source_with(&self, env: &KernelEnv, vec4: bool, parts: bool) -> KernelSource {
        let name = format!(
            "norm_{:?}_o{}_b{}_r{}{}{}",
            self.kind,
            self.weight_offset as u8,
            self.bias as u8,
            self.residual as u8,
            if parts { "_parts" } else { "" },
            if vec4 { "_v4" } else { "" }
        )
        .to_lowercase();
        let args = reduce_args(env);
        let (ty, lanes) = if vec4 { ("vec4<f32>", 4) } else { ("f32", 1) };
        // Sums of a value's lanes and of its squares.
        let (sum, sq) = if vec4 { ("dot(v, vec4<f32>(1.0))", "dot(v, v)") } else { ("v", "v * v") };
        let load = match (self.residual, parts) {
            (true, true) => "var v = x[xb + i]; for (var z = 1u; z < p.parts; z++) { v += x[z * p.split_off + xb + i]; } v = v + res[rb + i]; res[rb + i] = v;",
            (true, false) => "var v = x[xb + i] + res[rb + i]; res[rb + i] = v;",
            (false, _) => "let v = x[xb + i];",
        };
        let reload = if self.residual { "res[rb + i]" } else { "x[xb + i]" };
        let w = if self.weight_offset { "(1.0 + w[p.w_off + i])" } else { "w[p.w_off + i]" };
        let b = if self.bias { " + b[p.b_off + i]" } else { "" };
        let count = format!("f32(p.n * {lanes}u)");
        let stats = match self.kind {
            NormKind::Rms => format!(
                "    var ss = 0.0;\n    for (var i = lidx; i < p.n; i += 256u) {{ {load} ss += {sq}; }}\n    let mean = 0.0;\n    let inv = inverseSqrt(wg_sum(ss, {args}) / {count} + bitcast<f32>(p.eps));\n"
            ),
            NormKind::Layer => format!(
                "    var sm = 0.0;\n    for (var i = lidx; i < p.n; i += 256u) {{ {load} sm += {sum}; }}\n    let mean = wg_sum(sm, {args}) / {count};\n    var ss = 0.0;\n    for (var i = lidx; i < p.n; i += 256u) {{ let v = {reload} - mean; ss += {sq}; }}\n    let inv = inverseSqrt(wg_sum(ss, {args}) / {count} + bitcast<f32>(p.eps));\n"
            ),
        };
        let body = format!(
            "    let row = wg_linear;\n    if (row >= p.rows) {{ return; }}\n    let xb = p.x_off + row * p.x_stride;\n    let rb = p.res_off + row * p.res_stride;\n    let ob = p.out_off + row * p.out_stride;\n{stats}    for (var i = lidx; i < p.n; i += 256u) {{ out[ob + i] = ({reload} - mean) * inv * {w}{b}; }}\n"
        );
        let arr = format!("array<{ty}>");
        KernelBuilder::new(name, *env)
            .workgroup(256, 1, 1)
            .subgroup_builtins()
            .storage("x", Access::Read, &arr)
            .storage("w", Access::Read, &arr)
            .storage("b", Access::Read, &arr)
            .storage("res", Access::ReadWrite, &arr)
            .storage("out", Access::ReadWrite, &arr)
            .params(&PARAMS[..if parts { PARAMS.len() } else { PARAMS.len() - 2 }])
            .prelude(&workgroup_reduce_fns(env))
            .body(&body)
            .build()
    }

    /// A bias and a residual given exactly where the variant takes them.
    fn check_inputs(&self, op: &'static str, bias: bool, residual: bool) -> Result<()> {
        if self.bias != bias || self.residual != residual {
            let (want_b, want_r) = (self.bias, self.residual);
            let msg = format!("bias given: {bias}, residual given: {residual}; the variant takes a bias: {want_b}, a residual: {want_r}");
            return Err(bad(op, msg));
        }
        Ok(())
    }

    /// Runs the norm on GPU tensors (eagerly, through a [`NormPlan`] built for this call): `x` is
    /// `[rows, n]` f32 (contiguous), `w` (and `b`) `[n]`, `residual` `[rows, n]` (updated in place
    /// when the variant fuses the residual add). Returns `[rows, n]` f32.
    pub fn run(&self, ctx: &GpuContext, x: &Tensor, w: &Tensor, b: Option<&Tensor>, residual: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        const OP: &str = "norm";
        let n = *x.shape().last().ok_or_else(|| bad(OP, "x is a scalar (shape [rows, n] expected)"))?;
        if n == 0 {
            return Err(bad(OP, "rows of length 0"));
        }
        let rows = x.numel() / n;
        self.check_inputs(OP, b.is_some(), residual.is_some())?;
        if w.numel() != n || b.is_some_and(|b| b.numel() != n) {
            return Err(bad(OP, format!("weight ({}) or bias ({:?}) length differs from the row length {n}", w.numel(), b.map(|b| b.numel()))));
        }
        if let Some(r) = residual.filter(|r| r.numel() != rows * n) {
            return Err(bad(OP, format!("residual of {} elements, x has {}", r.numel(), rows * n)));
        }
        let out = Tensor::zeros(&[rows, n], numr::DType::F32, x.device())?;
        if rows == 0 {
            return Ok(out);
        }
        let f = |what, t: &Tensor| tensor_view(OP, what, t, DType::F32);
        let io = NormIo {
            x: f("x", x)?,
            w: f("weight", w)?,
            b: b.map(|b| f("bias", b)).transpose()?,
            residual: residual.map(|r| f("residual", r)).transpose()?,
            out: Some(f("out", &out)?),
        };
        let plan = NormPlan::new(ctx, self, &io, n, rows, eps)?;
        plan.run(ctx, &StepValues::chunk(0, to_u32(OP, "rows", rows)?))?;
        Ok(out)
    }

    /// CPU reference (f64 accumulation) over `x.len() / n` rows. Updates `residual` like the
    /// kernel. Lengths that disagree (x not whole rows, weight, bias or residual of the wrong
    /// length, or given against the variant) are [`crate::ops_common::OpsError::BadArgs`].
    pub fn reference(&self, x: &[f32], w: &[f32], b: Option<&[f32]>, mut residual: Option<&mut [f32]>, n: usize, eps: f32) -> Result<Vec<f32>> {
        const OP: &str = "norm reference";
        if n == 0 || !x.len().is_multiple_of(n) {
            return Err(bad(OP, format!("x of {} elements is not whole rows of {n}", x.len())));
        }
        if w.len() != n || b.is_some_and(|b| b.len() != n) {
            return Err(bad(OP, format!("weight ({}) or bias ({:?}) length differs from the row length {n}", w.len(), b.map(|b| b.len()))));
        }
        self.check_inputs(OP, b.is_some(), residual.is_some())?;
        if let Some(r) = residual.as_deref().filter(|r| r.len() != x.len()) {
            return Err(bad(OP, format!("residual of {} elements, x has {}", r.len(), x.len())));
        }
        let mut out = vec![0.0f32; x.len()];
        for r in 0..x.len() / n {
            let mut h: Vec<f64> = x[r * n..(r + 1) * n].iter().map(|&v| v as f64).collect();
            if let Some(res) = residual.as_deref_mut() {
                for (i, hv) in h.iter_mut().enumerate() {
                    let s = (*hv as f32 + res[r * n + i]) as f64;
                    res[r * n + i] = s as f32;
                    *hv = s;
                }
            }
            let mean = match self.kind {
                NormKind::Rms => 0.0,
                NormKind::Layer => h.iter().sum::<f64>() / n as f64,
            };
            let var = h.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for i in 0..n {
                let wi = w[i] as f64 + if self.weight_offset { 1.0 } else { 0.0 };
                out[r * n + i] = ((h[i] - mean) * inv * wi + b.map_or(0.0, |b| b[i] as f64)) as f32;
            }
        }
        Ok(out)
    }
}
