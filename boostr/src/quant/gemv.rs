//! [`QuantGemv`]: `y[m][n] = sum_k x[m][k] * W[n][k]` for 1..=8 activation rows (decode).
//!
//! A workgroup of `threads` invocations owns `rows_per_workgroup` consecutive weight rows; its
//! invocations split each row's 32-element chunks (invocation `t` takes chunks `t, t + threads,
//! ...`), so every activation chunk is loaded once and used for all the workgroup's rows (the
//! "several rows per subgroup" reuse: every subgroup covers every row of the workgroup). Per
//! chunk an invocation decodes each row with the format's shared decoder ([`super::decode`]),
//! converts the quant bytes once, and for each activation row forms two half-chunk dot products
//! scaled by the decoder's `a` plus `b * sum(x)` (the activation sums are shared by all rows).
//! Loads are `vec4<u32>` (weights) and `vec4<f32>` (activations); all per-row and per-activation
//! loops are unrolled by the generator. The partial sums are reduced with `subgroupAdd` and a
//! small workgroup array where the adapter has subgroups, else by a workgroup-memory tree.
//!
//! Options:
//! - `f16_math`: quant bytes and activations converted to f16, half-chunk dot products in f16,
//!   accumulated in f32 (needs SHADER_F16; quantized formats only).
//! - [`Prologue::RmsNorm`]: the fused RMSNorm. Each workgroup first reduces `sum(x^2)` of its
//!   activation rows (phase 1), then either stages `x * inv_rms * w` in workgroup memory
//!   (`stage_k >= K`) or applies the scale on the fly while loading (any K: no size cap).
//! - `split_qkv`: three outputs; rows `[0, nq)` go to `yq`, `[nq, nq + nk)` to `yk`, the rest to
//!   `yv` (Q/K/V packed into one matrix at upload by [`super::upload::concat_rows`]), which
//!   keeps the kernel at 6 or 7 storage bindings.
//! - `unchecked`: compile without naga's bounds checks; indexing is in bounds by construction
//!   (rows are clamped, chunks bounded by the row length), and the parity tests cover it.

use std::sync::Arc;

use numr::gpu::{Access, Binding, BoundGroup, GpuBuffer, GpuContext, Kernel, KernelBuilder, KernelEnv, KernelSource, Recorder, grid_2d};

use super::decode::{decoder, has_offset, is_quantized};
use super::{QuantError, QuantMatrix, Result, WeightKind};

/// What runs before the mat-vec inside the same dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prologue {
    None,
    /// `x / sqrt(mean(x^2) + eps) * w` (or `* (1 + w)` with `gemma`); activations staged in
    /// workgroup memory when `stage_k > 0` and `K <= stage_k`, else normalised while loading.
    RmsNorm {
        gemma: bool,
        stage_k: u32,
    },
}

/// A GEMV kernel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantGemv {
    pub kind: WeightKind,
    /// Weight rows per workgroup (each activation chunk is reused for all of them).
    pub rows_per_workgroup: u32,
    /// Invocations per workgroup (a multiple of the subgroup size).
    pub threads: u32,
    /// Reduce with subgroup operations (needs `env.subgroups`).
    pub subgroups: bool,
    /// f16 products with f32 accumulation (needs `env.f16`; quantized formats only).
    pub f16_math: bool,
    /// Activation rows (1..=8).
    pub activation_rows: u32,
    pub prologue: Prologue,
    pub split_qkv: bool,
    pub unchecked: bool,
}

impl QuantGemv {
    /// A good default for `kind` on `env` with `m` activation rows.
    pub fn new(kind: WeightKind, env: &KernelEnv, m: u32) -> QuantGemv {
        QuantGemv {
            kind,
            rows_per_workgroup: if m <= 2 { 4 } else { 2 },
            threads: if env.subgroups { 128 } else { 64 },
            subgroups: env.subgroups,
            f16_math: false,
            activation_rows: m,
            prologue: Prologue::None,
            split_qkv: false,
            unchecked: false,
        }
    }

    /// Every variant the tests validate with naga for `env`.
    pub fn all_for(env: &KernelEnv) -> Vec<QuantGemv> {
        let mut v = Vec::new();
        for kind in WeightKind::all() {
            for m in [1, 3, 8] {
                let base = QuantGemv::new(kind, env, m);
                v.push(base);
                if env.f16 && is_quantized(kind) {
                    v.push(QuantGemv { f16_math: true, ..base });
                }
                if m == 1 {
                    v.push(QuantGemv { prologue: Prologue::RmsNorm { gemma: false, stage_k: 4096 }, ..base });
                    v.push(QuantGemv { prologue: Prologue::RmsNorm { gemma: true, stage_k: 0 }, split_qkv: true, ..base });
                    v.push(QuantGemv { split_qkv: true, rows_per_workgroup: 8, unchecked: true, ..base });
                }
            }
        }
        v
    }

    fn name(&self) -> String {
        format!(
            "quant_gemv_{}_r{}_t{}_m{}{}{}{}{}{}",
            self.kind.name().to_lowercase(),
            self.rows_per_workgroup,
            self.threads,
            self.activation_rows,
            if self.subgroups { "_sg" } else { "" },
            if self.f16_math { "_f16" } else { "" },
            match self.prologue {
                Prologue::None => String::new(),
                Prologue::RmsNorm { gemma, stage_k } => format!("_rms{}{}", if gemma { "g" } else { "" }, stage_k),
            },
            if self.split_qkv { "_qkv" } else { "" },
            if self.unchecked { "_unchecked" } else { "" },
        )
    }

    /// The WGSL source for `env`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let r = self.rows_per_workgroup as usize;
        let mm = self.activation_rows as usize;
        let wg = self.threads;
        let sg = self.subgroups && env.subgroups;
        let f16 = self.f16_math && env.f16 && is_quantized(self.kind);
        let quant = is_quantized(self.kind);
        let offset = has_offset(self.kind);
        let v = r * mm;
        let mut pre = decoder(self.kind);
        pre.push_str(&reduce_fn(v, wg, sg, env));
        if v != mm {
            pre.push_str(&reduce_fn(mm, wg, sg, env));
        }
        // Activation loads.
        let (norm, stage) = match self.prologue {
            Prologue::None => (None, 0),
            Prologue::RmsNorm { gemma, stage_k } => (Some(gemma), stage_k / 4),
        };
        match norm {
            None => pre.push_str("fn ld_x(m: u32, i: u32) -> vec4<f32> { return x[m * p.k4 + i]; }\n"),
            Some(gemma) => {
                pre.push_str(&format!("var<workgroup> inv_rms: array<f32, {mm}>;\n"));
                let wexpr = if gemma { "(vec4<f32>(1.0) + nw[i])" } else { "nw[i]" };
                pre.push_str(&format!("fn norm_x(m: u32, i: u32) -> vec4<f32> {{ return x[m * p.k4 + i] * inv_rms[m] * {wexpr}; }}\n"));
                if stage > 0 {
                    pre.push_str(&format!("var<workgroup> xs: array<vec4<f32>, {}>;\n", stage as usize * mm));
                    pre.push_str(&format!(
                        "fn ld_x(m: u32, i: u32) -> vec4<f32> {{ if (p.k4 <= {stage}u) {{ return xs[m * {stage}u + i]; }} return norm_x(m, i); }}\n"
                    ));
                } else {
                    pre.push_str("fn ld_x(m: u32, i: u32) -> vec4<f32> { return norm_x(m, i); }\n");
                }
            }
        }
        let rargs = if sg { "lidx, sg_size, sg_id" } else { "lidx" };
        let mut b = String::new();
        b.push_str("    let row0 = wg_linear * ");
        b.push_str(&format!("{r}u;\n    if (row0 >= p.rows) {{ return; }}\n"));
        if norm.is_some() {
            // Phase 1: sum of squares per activation row.
            b.push_str(&format!("    var ss: array<f32, {mm}>;\n    for (var i = lidx; i < p.k4; i += {wg}u) {{\n"));
            for m in 0..mm {
                b.push_str(&format!("        let x{m} = x[{m}u * p.k4 + i];\n        ss[{m}] += dot(x{m}, x{m});\n"));
            }
            b.push_str(&format!(
                "    }}\n    let sst = wg_reduce_{mm}(ss, {rargs});\n    if (lidx < {mm}u) {{ inv_rms[lidx] = inverseSqrt(sst / f32(p.k4 * 4u) + bitcast<f32>(p.eps)); }}\n    workgroupBarrier();\n"
            ));
            if stage > 0 {
                b.push_str(&format!("    if (p.k4 <= {stage}u) {{\n        for (var i = lidx; i < p.k4; i += {wg}u) {{\n"));
                for m in 0..mm {
                    b.push_str(&format!("            xs[{m}u * {stage}u + i] = norm_x({m}u, i);\n"));
                }
                b.push_str("        }\n    }\n    workgroupBarrier();\n");
            }
        }
        for i in 0..r {
            b.push_str(&format!("    let rb{i} = min(row0 + {i}u, p.rows - 1u) * p.cpr;\n"));
        }
        b.push_str(&format!("    var acc: array<f32, {v}>;\n    for (var kc = lidx; kc < p.cpr; kc += {wg}u) {{\n        let xb = kc * 8u;\n"));
        let ty = if f16 { "f16" } else { "f32" };
        for i in 0..r {
            if quant {
                b.push_str(&format!("        let q{i} = dq(rb{i} + kc);\n"));
                for e in 0..8 {
                    b.push_str(&format!("        let f{i}_{e} = vec4<{ty}>(unpack4xI8(q{i}.w[{e}]));\n"));
                }
            } else {
                b.push_str(&format!("        let v{i} = dqv(rb{i} + kc);\n"));
            }
        }
        for m in 0..mm {
            for e in 0..8 {
                b.push_str(&format!("        let x{m}_{e} = ld_x({m}u, xb + {e}u);\n"));
                if f16 {
                    b.push_str(&format!("        let h{m}_{e} = vec4<f16>(x{m}_{e});\n"));
                }
            }
            if offset {
                b.push_str(&format!(
                    "        let s{m}a = dot(x{m}_0 + x{m}_1 + x{m}_2 + x{m}_3, vec4<f32>(1.0));\n        let s{m}b = dot(x{m}_4 + x{m}_5 + x{m}_6 + x{m}_7, vec4<f32>(1.0));\n"
                ));
            }
            for i in 0..r {
                let idx = i * mm + m;
                if quant {
                    let xn = if f16 { "h" } else { "x" };
                    let half = |lo: usize| {
                        let terms: Vec<String> = (lo..lo + 4).map(|e| format!("dot(f{i}_{e}, {xn}{m}_{e})")).collect();
                        if f16 { format!("f32({})", terms.join(" + ")) } else { terms.join(" + ") }
                    };
                    let mut t = format!("q{i}.a.x * ({}) + q{i}.a.y * ({})", half(0), half(4));
                    if offset {
                        t.push_str(&format!(" + q{i}.b.x * s{m}a + q{i}.b.y * s{m}b"));
                    }
                    b.push_str(&format!("        acc[{idx}] += {t};\n"));
                } else {
                    let terms: Vec<String> = (0..8).map(|e| format!("dot(v{i}[{e}], x{m}_{e})")).collect();
                    b.push_str(&format!("        acc[{idx}] += {};\n", terms.join(" + ")));
                }
            }
        }
        b.push_str("    }\n");
        b.push_str(&format!("    let tot = wg_reduce_{v}(acc, {rargs});\n    if (lidx < {v}u) {{\n"));
        b.push_str(&format!("        let row = row0 + lidx / {mm}u;\n        let m = lidx % {mm}u;\n        let g = p.row0 + row;\n"));
        b.push_str("        if (row < p.rows) {\n");
        if self.split_qkv {
            b.push_str(
                "            if (g < p.nq) { y[m * p.nq + g]= tot; }
            else if (g < p.nq + p.nk) { yk[m * p.nk + g - p.nq] = tot; }
            else { yv[m * p.nv + g - p.nq - p.nk] = tot; }
",
            );
        } else {
            b.push_str("            y[m * p.n_out + g] = tot;\n");
        }
        b.push_str("        }\n    }\n");

        let mut kb = KernelBuilder::new(self.name(), *env).workgroup(wg, 1, 1);
        if sg {
            kb = kb.subgroup_builtins();
        }
        if f16 {
            kb = kb.enable_f16();
        }
        kb = kb.storage("x", Access::Read, "array<vec4<f32>>");
        if norm.is_some() {
            kb = kb.storage("nw", Access::Read, "array<vec4<f32>>");
        }
        kb = kb.storage("wv", Access::Read, "array<vec4<u32>>").storage("ws", Access::Read, "array<u32>").storage("y", Access::ReadWrite, "array<f32>");
        if self.split_qkv {
            kb = kb.storage("yk", Access::ReadWrite, "array<f32>").storage("yv", Access::ReadWrite, "array<f32>");
        }
        kb.params(PARAMS).prelude(&pre).body(&b).build()
    }
}

/// Parameter words shared by the GEMV and GEMM kernels (GEMM adds `m`).
pub(crate) const PARAMS: &[&str] = &["rows", "row0", "n_out", "cpr", "k4", "qs4", "qh", "qh4", "sc", "dof", "mof", "cpg", "eps", "nq", "nk", "nv", "m"];

/// `fn wg_reduce_<v>(a: array<f32, v>, ...) -> f32`: the workgroup sum of element `lidx` of
/// every invocation's array, valid in invocations `lidx < v`. Call from uniform control flow.
pub(crate) fn reduce_fn(v: usize, wg: u32, sg: bool, env: &KernelEnv) -> String {
    if sg {
        let nsg_max = (wg / env.subgroup_min_size.max(4)).max(1) as usize;
        let mut s = format!(
            "var<workgroup> red{v}: array<f32, {}>;\nfn wg_reduce_{v}(a: array<f32, {v}>, lidx: u32, sg_size: u32, sg_id: u32) -> f32 {{\n    let sgi = lidx / sg_size;\n",
            nsg_max * v
        );
        for i in 0..v {
            s.push_str(&format!("    let t{i} = subgroupAdd(a[{i}]);\n"));
        }
        s.push_str("    if (sg_id == 0u) {\n");
        for i in 0..v {
            s.push_str(&format!("        red{v}[sgi * {v}u + {i}u] = t{i};\n"));
        }
        s.push_str(&format!(
            "    }}\n    workgroupBarrier();\n    var t = 0.0;\n    if (lidx < {v}u) {{\n        for (var s = 0u; s < {wg}u / sg_size; s++) {{ t += red{v}[s * {v}u + lidx]; }}\n    }}\n    workgroupBarrier();\n    return t;\n}}\n"
        ));
        s
    } else {
        let mut s = format!("var<workgroup> red{v}: array<f32, {}>;\nfn wg_reduce_{v}(a: array<f32, {v}>, lidx: u32) -> f32 {{\n", wg as usize * v);
        for i in 0..v {
            s.push_str(&format!("    red{v}[lidx * {v}u + {i}u] = a[{i}];\n"));
        }
        s.push_str(&format!("    workgroupBarrier();\n    for (var s = {}u; s > 0u; s >>= 1u) {{\n        if (lidx < s) {{\n", wg / 2));
        for i in 0..v {
            s.push_str(&format!("            red{v}[lidx * {v}u + {i}u] += red{v}[(lidx + s) * {v}u + {i}u];\n"));
        }
        s.push_str(&format!(
            "        }}\n        workgroupBarrier();\n    }}\n    var t = 0.0;\n    if (lidx < {v}u) {{ t = red{v}[lidx]; }}\n    workgroupBarrier();\n    return t;\n}}\n"
        ));
        s
    }
}

/// Parameter words of one part.
pub(crate) fn part_params(w: &QuantMatrix, part: &super::QuantPart) -> [u32; 17] {
    let s = part.sections;
    let cpg = match w.format {
        crate::formats::PackedFormat::Int4 { group_size, .. } => (group_size / 32) as u32,
        _ => 1,
    };
    [
        part.rows as u32,
        part.row0 as u32,
        w.rows as u32,
        w.chunks_per_row() as u32,
        (w.cols / 4) as u32,
        s.qs / 4,
        s.qh,
        s.qh / 4,
        s.sc,
        s.d,
        s.m,
        cpg,
        0,
        0,
        0,
        0,
        0,
    ]
}

/// Dispatches of one GEMV over every part of a matrix, with pipelines and bind groups built once.
pub struct GemvPlan {
    kernel: Arc<Kernel>,
    steps: Vec<(BoundGroup, Vec<u32>, [u32; 3])>,
}

/// Buffers of a GEMV: activations (`m x K` f32), the optional norm weight (`K` f32), outputs.
pub struct GemvIo<'a> {
    pub x: &'a Arc<GpuBuffer>,
    pub norm_weight: Option<&'a Arc<GpuBuffer>>,
    /// `y` (`m x N` f32), or `[yq, yk, yv]` with `split_qkv`.
    pub outputs: &'a [&'a Arc<GpuBuffer>],
    /// With `split_qkv`: rows of Q, K and V.
    pub qkv_rows: [usize; 3],
    pub eps: f32,
}

impl GemvPlan {
    pub fn new(ctx: &GpuContext, cfg: &QuantGemv, w: &QuantMatrix, io: &GemvIo<'_>) -> Result<GemvPlan> {
        if cfg.kind != w.kind() {
            return Err(QuantError::Shape { what: "gemv", reason: format!("kernel for {} given {}", cfg.kind.name(), w.kind().name()) });
        }
        if !(1..=8).contains(&cfg.activation_rows) {
            return Err(QuantError::Shape { what: "gemv", reason: format!("{} activation rows (1..=8)", cfg.activation_rows) });
        }
        let env = KernelEnv::from_caps(ctx.capabilities());
        let kernel = ctx.kernel(&cfg.source(&env))?;
        let mut steps = Vec::new();
        let [nq, nk, nv] = io.qkv_rows;
        if cfg.split_qkv && (nq + nk + nv != w.rows || io.outputs.len() != 3) {
            return Err(QuantError::Shape { what: "fused qkv", reason: format!("{nq} + {nk} + {nv} rows vs {} (three outputs needed)", w.rows) });
        }
        for part in &w.parts {
            let mut bind = vec![Binding::whole(io.x)];
            if matches!(cfg.prologue, Prologue::RmsNorm { .. }) {
                let nw = io.norm_weight.ok_or(QuantError::Shape { what: "gemv", reason: "RMSNorm needs its weight".into() })?;
                bind.push(Binding::whole(nw));
            }
            bind.push(part.binding());
            bind.push(part.binding());
            for o in io.outputs {
                bind.push(Binding::whole(o));
            }
            let group = ctx.bind(&kernel, &bind)?;
            let mut params = part_params(w, part).to_vec();
            params[12] = io.eps.to_bits();
            params[13] = nq as u32;
            params[14] = nk as u32;
            params[15] = nv as u32;
            let wgs = part.rows.div_ceil(cfg.rows_per_workgroup as usize) as u64;
            let grid = grid_2d(wgs, ctx.capabilities().limits.max_compute_workgroups_per_dimension)
                .ok_or(QuantError::Shape { what: "gemv", reason: format!("{wgs} workgroups") })?;
            steps.push((group, params, grid));
        }
        Ok(GemvPlan { kernel, steps })
    }

    /// Records the dispatches (one per part).
    pub fn record(&self, rec: &mut Recorder) -> Result<()> {
        for (g, p, grid) in &self.steps {
            rec.dispatch(&self.kernel, g, p, *grid)?;
        }
        Ok(())
    }
}
