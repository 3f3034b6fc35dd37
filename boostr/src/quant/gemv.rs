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
//! - [`Prologue::Glu`]: the GLU fused in: the activations are `[gate | up]` rows and the
//!   mat-vec runs on `act(gate) * up`, computed while loading (the down projection of an FFN
//!   without the separate activation dispatch).
//! - `accumulate`: `y += x Wᵀ` (the residual add fused into the output projection).
//! - `split_qkv`: three outputs; rows `[0, nq)` go to `yq`, `[nq, nq + nk)` to `yk`, the rest to
//!   `yv` (Q/K/V packed into one matrix at upload by [`super::upload::concat_rows`]), which
//!   keeps the kernel at 6 or 7 storage bindings.
//! - `unchecked`: [`GemvPlan`] compiles the kernel without naga's bounds checks once it has
//!   validated every binding (the invariant is stated at the `assume_in_bounds` call); the
//!   config's own [`QuantGemv::source`] is always checked.
//!
//! The reduction's subgroup slots are indexed by the `subgroup_id` builtin (`sg_idx`), never by
//! `lidx / sg_size`, which neither WGSL nor Vulkan promises to be the subgroup index.

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, Recorder, StepValues};

use super::decode::{decoder, has_offset, is_quantized};
pub use super::gemv_output::GemvOutput;
use super::gemv_output::out_cols;
use super::kernel_common::{PARAMS, grid_for, reduce_args, reduce_fn};
use super::part_plan::PartKernel;
use super::validate::{check_binding, check_threads, env_of, mul};
use super::{QuantError, QuantMatrix, Result, WeightKind};

/// What runs before the mat-vec inside the same dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prologue {
    /// The activations are used as given.
    None,
    /// `x / sqrt(mean(x^2) + eps) * w` (or `* (1 + w)` with `gemma`); activations staged in
    /// workgroup memory when `stage_k > 0` and `K <= stage_k`, else normalised while loading.
    RmsNorm {
        /// Gemma's weight offset: multiply by `1 + w`.
        gemma: bool,
        /// Largest K staged in workgroup memory (0: never stage).
        stage_k: u32,
    },
    /// The gated activation of the GLU: the activations are packed `[gate | up]` rows of
    /// `2 K` f32, and the mat-vec runs on `act(gate) * up` (computed while loading).
    Glu {
        /// The gate's nonlinearity.
        act: crate::act::ActKind,
    },
}

/// A GEMV kernel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantGemv {
    /// Weight format the kernel decodes.
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
    /// What runs before the mat-vec in the same dispatch.
    pub prologue: Prologue,
    /// Three outputs (Q, K, V) from one matrix packed at upload (see the module docs).
    pub split_qkv: bool,
    /// Rotate the Q/K rows and store K/V into the cache ([`super::rope_kv`]; build with
    /// [`GemvPlan::with_rope_kv`]).
    pub rope_kv: bool,
    /// `y += x Wᵀ`: each output is read and written by the one invocation that stores it (a
    /// residual add fused into the projection that produces the delta).
    pub accumulate: bool,
    /// Compile without naga's bounds checks: honoured only by [`GemvPlan`], once it has validated
    /// every binding; the config's own `source` is always checked.
    pub unchecked: bool,
    /// The activation rows are a step's first `p.m` rows (a per-step parameter; built with
    /// [`GemvPlan::decode_rows`]), taken `activation_rows` at a time in a loop inside the
    /// workgroup, so its weight rows are read from memory once for all of them: rows past `p.m`
    /// read row `p.m - 1` and store nothing. The RMSNorm prologue then reduces each group's
    /// rows in turn (normalised while loading, never staged). Without `split_qkv` or `rope_kv`.
    pub step_rows: bool,
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
            rope_kv: false,
            accumulate: false,
            unchecked: false,
            step_rows: false,
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
                if m == 8 {
                    v.push(QuantGemv { step_rows: true, ..base });
                    v.push(QuantGemv { step_rows: true, prologue: Prologue::RmsNorm { gemma: false, stage_k: 4096 }, ..base });
                    v.push(QuantGemv { step_rows: true, prologue: Prologue::Glu { act: crate::act::ActKind::Silu }, accumulate: true, ..base });
                }
                if m == 1 {
                    v.push(QuantGemv { prologue: Prologue::RmsNorm { gemma: false, stage_k: 4096 }, ..base });
                    v.push(QuantGemv { prologue: Prologue::RmsNorm { gemma: true, stage_k: 0 }, split_qkv: true, ..base });
                    v.push(QuantGemv { split_qkv: true, rows_per_workgroup: 8, ..base });
                    v.push(QuantGemv { prologue: Prologue::RmsNorm { gemma: false, stage_k: 0 }, rope_kv: true, ..base });
                    v.push(QuantGemv { accumulate: true, ..base });
                    v.push(QuantGemv { step_rows: true, ..base });
                    for act in [crate::act::ActKind::Silu, crate::act::ActKind::GeluTanh] {
                        v.push(QuantGemv { prologue: Prologue::Glu { act }, accumulate: true, ..base });
                    }
                }
            }
        }
        v
    }

    fn name(&self) -> String {
        format!(
            "quant_gemv_{}_r{}_t{}_m{}{}{}{}{}{}{}{}",
            self.kind.name().to_lowercase(),
            self.rows_per_workgroup,
            self.threads,
            self.activation_rows,
            if self.subgroups { "_sg" } else { "" },
            if self.f16_math { "_f16" } else { "" },
            match self.prologue {
                Prologue::None => String::new(),
                Prologue::RmsNorm { gemma, stage_k } => format!("_rms{}{}", if gemma { "g" } else { "" }, stage_k),
                Prologue::Glu { act } => format!("_glu{}", act.name()),
            },
            if self.split_qkv { "_qkv" } else { "" },
            if self.accumulate { "_acc" } else { "" },
            if self.rope_kv { "_ropekv" } else { "" },
            if self.step_rows { "_steprows" } else { "" },
        )
    }

    /// The WGSL source for `env` (compiled with bounds checks; see [`GemvPlan`] for `unchecked`).
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
            Prologue::None | Prologue::Glu { .. } => (None, 0),
            // A step's rows are normalised while loading (no staging: the groups would each
            // stage theirs).
            Prologue::RmsNorm { gemma, stage_k } => (Some(gemma), if self.step_rows { 0 } else { stage_k / 4 }),
        };
        match norm {
            None => match self.prologue {
                Prologue::Glu { act } => {
                    pre.push_str(crate::ops_common::SAFE_TANH);
                    pre.push_str(act.wgsl());
                    // With `step_rows`, `m` is the step's row, clamped to its rows.
                    let row = if self.step_rows { "min(m, p.m - 1u)" } else { "m" };
                    pre.push_str(&format!(
                        "fn ld_x(m: u32, i: u32) -> vec4<f32> {{
    let r = {row};
    let g = x[r * 2u * p.k4 + i];
    return vec4<f32>(act(g.x), act(g.y), act(g.z), act(g.w)) * x[r * 2u * p.k4 + p.k4 + i];
}}
"
                    ));
                }
                _ if self.step_rows => pre.push_str("fn ld_x(m: u32, i: u32) -> vec4<f32> { return x[min(m, p.m - 1u) * p.k4 + i]; }\n"),
                _ => pre.push_str("fn ld_x(m: u32, i: u32) -> vec4<f32> { return x[m * p.k4 + i]; }\n"),
            },
            Some(gemma) => {
                pre.push_str(&format!("var<workgroup> inv_rms: array<f32, {mm}>;\n"));
                let wexpr = if gemma { "(vec4<f32>(1.0) + nw[i])" } else { "nw[i]" };
                if self.step_rows {
                    // `m` is the step's row (`g0 + j`): clamped to the step's rows, its scale at
                    // `j = m % mm` (phase 1 runs once per group).
                    pre.push_str(&format!(
                        "fn norm_x(m: u32, i: u32) -> vec4<f32> {{ return x[min(m, p.m - 1u) * p.k4 + i] * inv_rms[m % {mm}u] * {wexpr}; }}\n"
                    ));
                } else {
                    pre.push_str(&format!("fn norm_x(m: u32, i: u32) -> vec4<f32> {{ return x[m * p.k4 + i] * inv_rms[m] * {wexpr}; }}\n"));
                }
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
        let rargs = reduce_args(sg);
        let mut b = String::new();
        b.push_str("    let row0 = wg_linear * ");
        b.push_str(&format!("{r}u;\n    if (row0 >= p.rows) {{ return; }}\n"));
        // Phase 1 of the RMSNorm prologue: sum of squares per activation row (`g0`: the first
        // row of a step's group, else none).
        let phase1 = |g0: &str| {
            let mut b = format!("    var ss: array<f32, {mm}>;\n    for (var i = lidx; i < p.k4; i += {wg}u) {{\n");
            for m in 0..mm {
                let row = if g0.is_empty() { format!("{m}u") } else { format!("min({g0} + {m}u, p.m - 1u)") };
                b.push_str(&format!("        let x{m} = x[{row} * p.k4 + i];\n        ss[{m}] += dot(x{m}, x{m});\n"));
            }
            b.push_str(&format!(
                "    }}\n    let sst = wg_reduce_{mm}(ss, {rargs});\n    if (lidx < {mm}u) {{ inv_rms[lidx] = inverseSqrt(sst / f32(p.k4 * 4u) + bitcast<f32>(p.eps)); }}\n    workgroupBarrier();\n"
            ));
            b
        };
        if norm.is_some() && !self.step_rows {
            b.push_str(&phase1(""));
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
        // With `step_rows`, the rest runs once per group of `mm` of the step's rows (`g0`).
        let g0 = if self.step_rows {
            b.push_str(&format!("    for (var g0 = 0u; g0 < p.m; g0 += {mm}u) {{\n"));
            if norm.is_some() {
                // Uniform: `p.m` is a parameter, so every invocation meets these barriers, and
                // the reductions' barriers order the last group's reads of `inv_rms` before
                // this group's writes.
                b.push_str(&phase1("g0"));
            }
            "g0 + "
        } else {
            ""
        };
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
                b.push_str(&format!("        let x{m}_{e} = ld_x({g0}{m}u, xb + {e}u);\n"));
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
        if self.rope_kv {
            pre.push_str(&super::rope_kv::prelude(Some(v)));
            b.push_str(&format!("    let tot = wg_reduce_{v}(acc, {rargs});\n"));
            b.push_str(&super::rope_kv::store_reduced(v, "tot"));
            return self.finish(env, pre, b, norm.is_some());
        }
        b.push_str(&format!("    let tot = wg_reduce_{v}(acc, {rargs});\n    if (lidx < {v}u) {{\n"));
        b.push_str(&format!("        let row = row0 + lidx / {mm}u;\n        let m = {g0}lidx % {mm}u;\n        let g = p.row0 + row;\n"));
        b.push_str(if self.step_rows { "        if (row < p.rows && m < p.m) {\n" } else { "        if (row < p.rows) {\n" });
        if self.split_qkv {
            b.push_str(
                "            if (g < p.nq) { y[m * p.nq + g]= tot; }
            else if (g < p.nq + p.nk) { yk[m * p.nk + g - p.nq] = tot; }
            else { yv[m * p.nv + g - p.nq - p.nk] = tot; }
",
            );
        } else {
            b.push_str(if self.accumulate {
                "            y[m * p.n_out + g] = y[m * p.n_out + g] + tot;\n"
            } else {
                "            y[m * p.n_out + g] = tot;\n"
            });
        }
        b.push_str("        }\n    }\n");
        if self.step_rows {
            b.push_str("    }\n");
        }
        self.finish(env, pre, b, norm.is_some())
    }

    /// The kernel around the generated prelude and body.
    fn finish(&self, env: &KernelEnv, pre: String, b: String, norm: bool) -> KernelSource {
        let wg = self.threads;
        let sg = self.subgroups && env.subgroups;
        let f16 = self.f16_math && env.f16 && is_quantized(self.kind);
        let mut kb = KernelBuilder::new(self.name(), *env).workgroup(wg, 1, 1);
        if sg {
            kb = kb.subgroup_builtins();
        }
        if f16 {
            kb = kb.enable_f16();
        }
        kb = kb.storage("x", Access::Read, "array<vec4<f32>>");
        if norm {
            kb = kb.storage("nw", Access::Read, "array<vec4<f32>>");
        }
        kb = kb.storage("wv", Access::Read, "array<vec4<u32>>").storage("ws", Access::Read, "array<u32>").storage("y", Access::ReadWrite, "array<f32>");
        if self.split_qkv {
            kb = kb.storage("yk", Access::ReadWrite, "array<f32>").storage("yv", Access::ReadWrite, "array<f32>");
        }
        if self.rope_kv {
            kb = super::rope_kv::bind(kb);
            let params: Vec<&str> = PARAMS.iter().chain(super::rope_kv::PARAMS).copied().collect();
            return kb.params(&params).prelude(&pre).body(&b).build();
        }
        kb.params(PARAMS).prelude(&pre).body(&b).build()
    }
}

/// The bindings of a GEMV: activations (`m x K` f32), the norm weight of the RMSNorm prologue
/// (`K` f32, with its `eps`), and the output(s).
#[derive(Clone, Debug)]
pub struct GemvIo {
    /// Activations: `m x K` f32 (`m x 2K`, `[gate | up]` rows, with [`Prologue::Glu`]).
    pub x: Binding,
    /// With [`Prologue::RmsNorm`] (and only then).
    pub norm_weight: Option<Binding>,
    /// The RMSNorm epsilon (ignored without the prologue).
    pub eps: f32,
    /// Where the results go.
    pub output: GemvOutput,
}

impl GemvIo {
    /// `y = x Wᵀ` (no prologue).
    pub fn new(x: Binding, y: Binding) -> GemvIo {
        GemvIo { x, norm_weight: None, eps: 0.0, output: GemvOutput::Single(y) }
    }

    /// The same with the RMSNorm prologue's weight and epsilon.
    pub fn with_rms_norm(mut self, weight: Binding, eps: f32) -> GemvIo {
        self.norm_weight = Some(weight);
        self.eps = eps;
        self
    }
}

/// One GEMV over every part of a matrix (one dispatch per part), built once: kernels, bind
/// groups and parameters by name in a [`Plan`]. It depends on no step value (the activation
/// rows are the config's).
#[derive(Clone, Debug)]
pub struct GemvPlan {
    plan: Plan,
}

impl GemvPlan {
    /// Validates `cfg`, `w` and every binding of `io` (each short one is
    /// [`QuantError::BufferTooSmall`] naming it), then builds the dispatches.
    pub fn new(ctx: &GpuContext, cfg: &QuantGemv, w: &QuantMatrix, io: &GemvIo) -> Result<GemvPlan> {
        Self::build(ctx, cfg, w, io, None, None)
    }

    /// The decode rows of a batched step (`cfg.step_rows`): the first
    /// [`StepValues::decode_rows`] rows of `io.x` (`max_m x K`) into the same rows of the output
    /// (`max_m` rows), `cfg.activation_rows` at a time inside one dispatch per part; a step
    /// without decode rows skips it. A row's numbers depend on that row alone.
    pub fn decode_rows(ctx: &GpuContext, cfg: &QuantGemv, w: &QuantMatrix, io: &GemvIo, max_m: usize) -> Result<GemvPlan> {
        if !cfg.step_rows {
            return Err(QuantError::Config { what: "gemv", reason: "GemvPlan::decode_rows builds a step_rows config".into() });
        }
        Self::build(ctx, cfg, w, io, None, Some(max_m))
    }

    /// The decode Q/K/V projection with the RoPE + KV-cache epilogue (`cfg.rope_kv`, see
    /// [`super::rope_kv`]); `io.output` must be the packed row ([`GemvOutput::Single`]).
    pub fn with_rope_kv(ctx: &GpuContext, cfg: &QuantGemv, w: &QuantMatrix, io: &GemvIo, rope: &super::RopeKv) -> Result<GemvPlan> {
        Self::build(ctx, cfg, w, io, Some(rope), None)
    }

    /// `stepped`: `Some(max_m)` for a `step_rows` config (the step's decode rows, at most `max_m`).
    fn build(ctx: &GpuContext, cfg: &QuantGemv, w: &QuantMatrix, io: &GemvIo, rope: Option<&super::RopeKv>, stepped: Option<usize>) -> Result<GemvPlan> {
        const OP: &str = "gemv";
        if cfg.step_rows != stepped.is_some() {
            return Err(QuantError::Config { what: OP, reason: "a step_rows GEMV is built with GemvPlan::decode_rows".into() });
        }
        if cfg.step_rows && (cfg.split_qkv || cfg.rope_kv) {
            return Err(QuantError::Config { what: OP, reason: "step_rows with split_qkv or rope_kv".into() });
        }
        if cfg.kind != w.kind() {
            return Err(QuantError::Shape { what: OP, reason: format!("kernel for {} given {}", cfg.kind.name(), w.kind().name()) });
        }
        w.validate()?;
        let m = cfg.activation_rows as usize;
        if !(1..=8).contains(&m) {
            return Err(QuantError::Shape { what: OP, reason: format!("{m} activation rows (1..=8)") });
        }
        if !(1..=32).contains(&cfg.rows_per_workgroup) {
            return Err(QuantError::Config { what: OP, reason: format!("{} rows per workgroup (1..=32)", cfg.rows_per_workgroup) });
        }
        let caps = ctx.capabilities();
        check_threads(OP, caps, cfg.threads, cfg.rows_per_workgroup * cfg.activation_rows)?;
        let x_cols = if matches!(cfg.prologue, Prologue::Glu { .. }) { mul("x elements", 2, w.cols)? } else { w.cols };
        // The rows the bindings hold: the config's, or a stepped plan's most.
        let held = stepped.unwrap_or(m);
        if held == 0 {
            return Err(QuantError::Shape { what: OP, reason: "a GEMV plan for 0 activation rows".into() });
        }
        check_binding(OP, "x", &io.x, mul("x elements", held, x_cols)?, 4)?;
        if cfg.accumulate && cfg.split_qkv {
            return Err(QuantError::Config { what: OP, reason: "accumulate with split_qkv".into() });
        }
        let norm = matches!(cfg.prologue, Prologue::RmsNorm { .. });
        match (norm, &io.norm_weight) {
            (true, Some(nw)) => check_binding(OP, "norm weight", nw, w.cols, 4)?,
            (true, None) => return Err(QuantError::Shape { what: OP, reason: "the RMSNorm prologue needs its weight".into() }),
            (false, Some(_)) => return Err(QuantError::Shape { what: OP, reason: "a norm weight given without the RMSNorm prologue".into() }),
            (false, None) => {}
        }
        let (outputs, qkv) = io.output.checked(OP, cfg.split_qkv, held, w.rows)?;
        let max = u32::try_from(held).map_err(|_| QuantError::Shape { what: OP, reason: format!("{held} activation rows") })?;
        let rope = match rope {
            _ if cfg.rope_kv != rope.is_some() => return Err(QuantError::Config { what: OP, reason: "rope_kv is built with GemvPlan::with_rope_kv".into() }),
            Some(_) if cfg.split_qkv || cfg.accumulate || !matches!(io.output, GemvOutput::Single(_)) => {
                return Err(QuantError::Config { what: OP, reason: "rope_kv with split_qkv, accumulate or a column output".into() });
            }
            Some(rk) => Some(super::rope_kv::check(ctx, OP, w, cfg.activation_rows, cfg.rows_per_workgroup, 0, rk)?),
            None => None,
        };
        let kernel = PartKernel {
            src: cfg.source(&env_of(caps)),
            unchecked: cfg.unchecked,
            before: [io.x.clone()].into_iter().chain(io.norm_weight.iter().cloned()).collect(),
            after: outputs.iter().cloned().chain(rope.iter().flat_map(|c| c.bindings().iter().cloned())).collect(),
            cols: out_cols(&io.output, w.rows),
        };
        // SAFETY: the GEMV's indices are bounded as follows, by what was validated above.
        // - `x[m * k4 + i]` (vec4): `m < activation_rows`, `i < k4 = K / 4` (the phase-1 loop
        //   bound, and `kc * 8 + e` with `kc < cpr = K / 32`, `e < 8`); `x` holds
        //   `activation_rows * K` f32. With the GLU prologue `x[m * 2 k4 + i]` and
        //   `x[m * 2 k4 + k4 + i]`: `x` holds `activation_rows * 2 K` f32 (checked). `nw[i]`, `i < k4`: the norm weight holds `K` f32.
        //   The staged `xs[m * stage + i]` is used only when `k4 <= stage` (`i < k4`).
        //   With `step_rows`, the row is `min(g0 + m, p.m - 1)` where `p.m = min(decode_rows,
        //   max_m) >= 1` (the grid is empty when it is 0), and `x` holds `max_m * K` f32.
        // - Weight chunk `c = min(row0 + r, rows - 1) * cpr + kc` (`rows >= 1`, `kc < cpr`) is
        //   below the part's `rows * cpr` chunks, and `w.validate()` checked that the part's
        //   sections are those of its rows inside its buffer, so every decoder read is in it.
        // - `y[m * n_out + g]` with `g = row0 + row < N` (`row < rows` is tested before the
        //   store; with `GemvOutput::Columns`, `g < offset + N <= stride = n_out`, and `y`
        //   holds `activation_rows * stride`, checked), or with `split_qkv` `g < nq`, `g - nq < nk`, `g - nq - nk < nv` where
        //   `nq + nk + nv = N`; each output holds `activation_rows` of its rows. With
        //   `step_rows`, stores need `m = g0 + lidx % mm < p.m <= max_m`, and each output holds
        //   `max_m` rows (checked).
        // - `red` (tree): `(lidx + s) * v + i` with `lidx < s <= threads / 2`; `red`
        //   (subgroups): slots `sg_idx < min(sg_count, slots)`. `inv_rms[lidx]` under
        //   `lidx < activation_rows`. Every product above fits 32 bits (checked).
        // - The RoPE + KV epilogue: as stated in `gemv_q8.rs` (`rope_kv::check`).
        let plan = unsafe {
            kernel.plan(
                ctx,
                w,
                |_, part| grid_for(ctx, part.rows.div_ceil(cfg.rows_per_workgroup as usize)),
                |_, part, d| {
                    let d = d.set_f32("eps", io.eps)?.set_usize("nq", qkv[0])?.set_usize("nk", qkv[1])?.set_usize("nv", qkv[2])?;
                    let d = if cfg.step_rows {
                        let grid = grid_for(ctx, part.rows.div_ceil(cfg.rows_per_workgroup as usize))?;
                        d.per_step("m", move |s| s.decode_rows.min(max))?.grid_per_step(move |s| if s.decode_rows == 0 { [0, 0, 0] } else { grid })
                    } else {
                        d
                    };
                    match &rope {
                        Some(c) => c.set(d),
                        None => Ok(d),
                    }
                },
            )?
        };
        Ok(GemvPlan { plan })
    }

    /// The dispatches, for an engine to append to its own plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Records the dispatches (one per part); the GEMV reads no step value.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        Ok(self.plan.record(rec, step)?)
    }

    /// Records into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &GpuContext, step: &StepValues) -> Result<()> {
        Ok(self.plan.run(ctx, step)?)
    }
}
