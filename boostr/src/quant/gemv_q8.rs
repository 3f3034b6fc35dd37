//! [`QuantGemvQ8`]: the integer-dot GEMV (decode), `y[m][n] = sum_k x[m][k] * W[n][k]` for
//! 1..=8 activation rows, with the activations quantized to int8 per 32-element block first.
//!
//! Two dispatches, recorded together by [`Q8GemvPlan`]:
//! 1. [`super::QuantizeQ8`] or the fused [`super::RmsNormQuantizeQ8`] (file `q8_activations.rs`): `d = max|x| / 127`,
//!    `q = round(x / d)` packed four per word (`xq`, two `vec4<u32>` per block), and per block
//!    `vec4(d, d * sum(q[0..16]), d * sum(q[16..32]), 0)` (`xs`). In a model the same quantized
//!    activations serve every projection that reads them (Q/K/V, gate/up).
//! 2. The GEMV: a workgroup of `threads` invocations owns `rows_per_workgroup` rows; invocation
//!    `t` takes `unroll` chunks of 32 per step (chunks `t + u * threads`, or `unroll`
//!    consecutive chunks with `contiguous`), each decoded once by the format's shared decoder
//!    ([`super::decode`]), whose quant bytes go straight into `dot4I8Packed` against the int8
//!    activations loaded once for all rows. Per chunk and row:
//!    `acc += d_x * (a.x * dot_lo + a.y * dot_hi) + b.x * s_lo + b.y * s_hi` (the decoder's
//!    affine map `w = a * q + b` per 16 elements). The steps past the row end are clamped and
//!    weighted by zero, so the inner loop has no branches. The partial sums are reduced like the
//!    f32 GEMV's ([`super::gemv`]). Options: `subgroup_rows` (each subgroup owns whole rows and
//!    reduces them alone with `subgroupAdd`, no workgroup barrier), `prefetch` (each step
//!    loads the next step's chunks before its own dot products) and `accumulate` (`y += x Wᵀ`,
//!    the residual add of a decode step fused into the projection producing the delta).
//!
//! Accuracy: the products are exact integers; the only error beyond f32 rounding is the int8
//! rounding of the activations (at most `d / 2` per element, the scheme of llama.cpp's Q8_1 path).
//! The tests check the GEMV against the CPU reference on the GPU's own quantized activations
//! (f32 tolerance) and against the unquantized reference (1e-2).
//!
//! Subgroups are placed by the `subgroup_id` / `num_subgroups` builtins (`sg_idx`, `sg_count`),
//! never by `lidx / sg_size`. `unchecked` is honoured by [`Q8GemvPlan`] once it has validated
//! every binding; [`QuantGemvQ8::source`] is always compiled with bounds checks.

use numr::gpu::{Access, Binding, BufferKind, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, Recorder, StepValues};

use super::decode::{decoder, is_quantized};
use super::gemv::{GemvOutput, PARAMS, grid_for, out_cols, reduce_args, reduce_fn, set_out_cols, set_part};
use super::q8_activations::Q8Activations;
use super::q8_epilogue::Q8Epilogue;
use super::validate::{check_binding, check_threads, env_of, mul};
use super::{QuantError, QuantMatrix, Result, WeightKind};

/// An integer-dot GEMV configuration (quantized formats only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantGemvQ8 {
    /// Weight format the kernel decodes (a quantized one).
    pub kind: WeightKind,
    /// Weight rows per workgroup (each activation chunk is loaded once for all of them).
    pub rows_per_workgroup: u32,
    /// Invocations per workgroup (a multiple of the subgroup size).
    pub threads: u32,
    /// Chunks of 32 per invocation per step (independent loads in flight).
    pub unroll: u32,
    /// An invocation's `unroll` chunks are consecutive (else `threads` apart).
    pub contiguous: bool,
    /// Reduce with subgroup operations (needs `env.subgroups`).
    pub subgroups: bool,
    /// With subgroups: each subgroup owns `subgroup_rows` rows at a time (its lanes split K and
    /// it reduces them alone, with no workgroup barrier), and the workgroup's subgroups take the
    /// `rows_per_workgroup` rows in turn. 0: the whole workgroup splits K of every row. Larger
    /// workgroups over more rows mean fewer workgroups per dispatch, whose launch costs about a
    /// nanosecond each on the H200 (`cargo xtask bench --kernels --only probe`).
    pub subgroup_rows: u32,
    /// Software pipelining: each step loads (and decodes) the next step's weight chunks before
    /// the dot products of the current ones, so a step's memory latency overlaps the previous
    /// step's math.
    pub prefetch: bool,
    /// Three outputs: rows `[0, nq)` go to `y`, `[nq, nq + nk)` to `yk`, the rest to `yv` (Q/K/V
    /// packed into one matrix at upload), seven storage bindings in all.
    pub split_qkv: bool,
    /// `y += x Wᵀ`: each output is read and written by the one invocation that stores it (a
    /// residual add fused into the projection that produces the delta).
    pub accumulate: bool,
    /// Activation rows (1..=8).
    pub activation_rows: u32,
    /// The activations carry an RMSNorm whose `1 / rms` this GEMV applies: it sums the blocks'
    /// `xs.w` (each block's `sum(x^2)`) and scales its sums by `1 / sqrt(sum / K + eps)`
    /// ([`super::DeferredRmsQuantizeQ8`], [`Q8Epilogue::Quantize`]).
    pub rms_scale: bool,
    /// What the GEMV writes besides its output ([`super::q8_epilogue`]): its own output
    /// quantized for the next projection.
    pub epilogue: Q8Epilogue,
    /// Compile without naga's bounds checks: honoured only by [`Q8GemvPlan`], once it has validated
    /// every binding; the config's own `source` is always checked.
    pub unchecked: bool,
}

impl QuantGemvQ8 {
    /// Whether the integer-dot path decodes `kind` (every quantized format).
    pub fn supports(kind: WeightKind) -> bool {
        is_quantized(kind)
    }

    /// The default for `kind` on `env` with `m` activation rows (the best of the H200 sweeps at
    /// 4096x14336 for m = 1, `cargo xtask bench --kernels --only gemv|probe`: one row per
    /// 32-invocation workgroup with two chunks in flight; two rows for Q4_K/Q5_K, whose
    /// scale unpacking the activations' loads then amortise).
    pub fn new(kind: WeightKind, env: &KernelEnv, m: u32) -> QuantGemvQ8 {
        use crate::formats::GgmlType::{Q4_K, Q5_K};
        let kq45 = matches!(kind, WeightKind::Ggml(Q4_K | Q5_K));
        QuantGemvQ8 {
            kind,
            rows_per_workgroup: if m <= 2 && !kq45 { 1 } else { 2 },
            threads: if m <= 2 { 32 } else { 64 },
            unroll: if m <= 2 { 2 } else { 1 },
            contiguous: false,
            subgroups: env.subgroups,
            subgroup_rows: 0,
            prefetch: false,
            split_qkv: false,
            accumulate: false,
            activation_rows: m,
            rms_scale: false,
            epilogue: Q8Epilogue::None,
            unchecked: false,
        }
    }

    /// The default for a `rows x cols` matrix: [`QuantGemvQ8::new`], with two rows per workgroup
    /// for one or two activation rows where the matrix has many short rows (more than 8192 rows of
    /// at most 4096 inputs, as Llama-3-8B's 14336x4096 FFN up/gate): one-row workgroups are then
    /// too many and too short (each costs about a nanosecond to launch on the H200, and they
    /// spill past one wave). Measured at 14336x4096 on the H200: Q4_0 59% -> 80% and Q8_0
    /// 76% -> 90% of the roofline without barriers, 53% -> 57% and 67% -> 71% in a chain.
    pub fn for_matrix(kind: WeightKind, env: &KernelEnv, m: u32, rows: usize, cols: usize) -> QuantGemvQ8 {
        let base = QuantGemvQ8::new(kind, env, m);
        if m <= 2 && rows > 8192 && cols <= 4096 { QuantGemvQ8 { rows_per_workgroup: 2, ..base } } else { base }
    }

    /// Every variant the tests validate with naga for `env`.
    pub fn all_for(env: &KernelEnv) -> Vec<QuantGemvQ8> {
        let mut v = Vec::new();
        for kind in WeightKind::all().into_iter().filter(|&k| Self::supports(k)) {
            for m in [1, 3, 8] {
                let base = QuantGemvQ8::new(kind, env, m);
                v.push(base);
                if m == 1 {
                    v.push(QuantGemvQ8 { unroll: 4, contiguous: true, rows_per_workgroup: 4, ..base });
                }
                v.push(QuantGemvQ8 { subgroup_rows: 1, rows_per_workgroup: 8, threads: 256, ..base });
                v.push(QuantGemvQ8 { subgroup_rows: 2, rows_per_workgroup: 8, threads: 128, contiguous: true, ..base });
                v.push(QuantGemvQ8 { prefetch: true, ..base });
                v.push(QuantGemvQ8 { prefetch: true, subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base });
                v.push(QuantGemvQ8 { split_qkv: true, ..base });
                v.push(QuantGemvQ8 { split_qkv: true, subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base });
                v.push(QuantGemvQ8 { accumulate: true, ..base });
                v.push(QuantGemvQ8 { accumulate: true, subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base });
                v.push(QuantGemvQ8 { rms_scale: true, ..base });
                v.push(QuantGemvQ8 { rms_scale: true, subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base });
                if m == 1 && env.coherent {
                    for epilogue in [
                        Q8Epilogue::Quantize { norm: true, gemma: false },
                        Q8Epilogue::Quantize { norm: true, gemma: true },
                        Q8Epilogue::Quantize { norm: false, gemma: false },
                        Q8Epilogue::Glu { act: crate::act::ActKind::Silu },
                        Q8Epilogue::Glu { act: crate::act::ActKind::GeluTanh },
                    ] {
                        v.push(QuantGemvQ8 { epilogue, accumulate: matches!(epilogue, Q8Epilogue::Quantize { .. }), ..base });
                        v.push(QuantGemvQ8 { epilogue, rms_scale: true, rows_per_workgroup: 2, ..base });
                        v.push(QuantGemvQ8 { epilogue, subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base });
                    }
                }
            }
        }
        v
    }

    fn name(&self) -> String {
        format!(
            "quant_gemv_q8_{}_r{}_t{}_u{}{}{}_m{}{}{}{}{}{}",
            self.kind.name().to_lowercase(),
            self.rows_per_workgroup,
            self.threads,
            self.unroll,
            if self.contiguous { "c" } else { "" },
            if self.prefetch { "p" } else { "" },
            self.activation_rows,
            match (self.subgroups, self.subgroup_rows) {
                (false, _) => String::new(),
                (true, 0) => "_sg".to_string(),
                (true, n) => format!("_sgrows{n}"),
            },
            if self.split_qkv { "_qkv" } else { "" },
            if self.accumulate { "_acc" } else { "" },
            if self.rms_scale { "_rms" } else { "" },
            self.epilogue.name(),
        )
    }

    /// Whether the kernel runs in subgroup-rows mode on `env`.
    fn per_subgroup(&self, env: &KernelEnv) -> bool {
        self.subgroups && env.subgroups && self.subgroup_rows > 0
    }

    /// The K loop over `r` rows whose first chunks are `rb0..`: `first`/`step`/`stride` place
    /// an invocation's chunks; `acc` gets `r * m` sums (row-major over rows, then activations).
    fn k_loop(&self, r: usize, extra: usize, first: &str, step: &str, stride: &str) -> String {
        let mm = self.activation_rows as usize;
        let un = self.unroll as usize;
        let mut b = format!("    var acc: array<f32, {}>;\n", r * mm + extra);
        if self.prefetch {
            for u in 0..un {
                for i in 0..r {
                    b.push_str(&format!("    var q{i}_{u} = dq(rb{i} + min({first} + {u}u * {stride}, p.cpr - 1u));\n"));
                }
            }
        }
        b.push_str(&format!("    for (var kb = {first}; kb < p.cpr; kb += {step}) {{\n"));
        for u in 0..un {
            b.push_str(&format!("        let k{u} = kb + {u}u * {stride};\n        let c{u} = min(k{u}, p.cpr - 1u);\n        let ok{u} = k{u} < p.cpr;\n"));
            if self.prefetch {
                b.push_str(&format!("        let nc{u} = min(k{u} + {step}, p.cpr - 1u);\n"));
                for i in 0..r {
                    b.push_str(&format!("        let n{i}_{u} = dq(rb{i} + nc{u});\n"));
                }
            }
        }
        for u in 0..un {
            for m in 0..mm {
                b.push_str(&format!(
                    "        let xa{m}_{u} = xq[({m}u * p.cpr + c{u}) * 2u];\n        let xb{m}_{u} = xq[({m}u * p.cpr + c{u}) * 2u + 1u];\n        let xs{m}_{u} = select(vec4<f32>(0.0), xs[{m}u * p.cpr + c{u}], ok{u});\n"
                ));
            }
            if !self.prefetch {
                for i in 0..r {
                    b.push_str(&format!("        let q{i}_{u} = dq(rb{i} + c{u});\n"));
                }
            }
        }
        for u in 0..un {
            for i in 0..r {
                for m in 0..mm {
                    let dot = |lo: usize, xv: &str| {
                        ["x", "y", "z", "w"]
                            .iter()
                            .enumerate()
                            .map(|(e, f)| format!("dot4I8Packed(q{i}_{u}.w[{}], {xv}{m}_{u}.{f})", lo + e))
                            .collect::<Vec<_>>()
                            .join(" + ")
                    };
                    b.push_str(&format!(
                        "        acc[{}] += xs{m}_{u}.x * (q{i}_{u}.a.x * f32({}) + q{i}_{u}.a.y * f32({})) + q{i}_{u}.b.x * xs{m}_{u}.y + q{i}_{u}.b.y * xs{m}_{u}.z;\n",
                        i * mm + m,
                        dot(0, "xa"),
                        dot(4, "xb")
                    ));
                }
            }
        }
        if self.prefetch {
            for u in 0..un {
                for i in 0..r {
                    b.push_str(&format!("        q{i}_{u} = n{i}_{u};\n"));
                }
            }
        }
        b.push_str("    }\n");
        b
    }

    /// The WGSL statement storing `val` for activation row `m` and global weight row `g`.
    fn store(&self, m: &str, g: &str, val: &str) -> String {
        if self.split_qkv {
            format!(
                "let g = {g}; if (g < p.nq) {{ y[{m} * p.nq + g] = {val}; }} else if (g < p.nq + p.nk) {{ yk[{m} * p.nk + g - p.nq] = {val}; }} else {{ yv[{m} * p.nv + g - p.nq - p.nk] = {val}; }}"
            )
        } else if self.accumulate {
            format!("let o = {m} * p.n_out + {g}; y[o] = y[o] + {val};")
        } else {
            format!("y[{m} * p.n_out + {g}] = {val};")
        }
    }

    /// The WGSL source for `env` (compiled with bounds checks; see [`Q8GemvPlan`] for
    /// `unchecked`).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let r = self.rows_per_workgroup as usize;
        let mm = self.activation_rows as usize;
        let (wg, un) = (self.threads, self.unroll as usize);
        let sg = self.subgroups && env.subgroups;
        let mut pre = decoder(self.kind);
        let mut b = format!("    let row0 = wg_linear * {r}u;\n    if (row0 >= p.rows) {{ return; }}\n");
        if self.per_subgroup(env) {
            // Each subgroup (`sg_idx` of `sg_count`) walks its rows `n` at a time; lanes split K;
            // no workgroup barrier.
            let n = self.subgroup_rows as usize;
            let v = n * mm;
            if self.rms_scale {
                // Each subgroup sums the blocks' sum(x^2) itself (no workgroup barrier).
                for m in 0..mm {
                    b.push_str(&format!(
                        "    var ssp{m} = 0.0;\n    for (var b = sg_id; b < p.cpr; b += sg_size) {{ ssp{m} += xs[{m}u * p.cpr + b].w; }}\n    let rinv{m} = inverseSqrt(subgroupAdd(ssp{m}) / f32(p.cpr * 32u) + bitcast<f32>(p.eps));\n"
                    ));
                }
            }
            b.push_str(&format!(
                "    for (var rr = sg_idx * {n}u; rr < {r}u; rr += sg_count * {n}u) {{\n    let r0 = row0 + rr;\n    if (r0 >= p.rows) {{ break; }}\n"
            ));
            for i in 0..n {
                b.push_str(&format!("    let rb{i} = min(r0 + {i}u, p.rows - 1u) * p.cpr;\n"));
            }
            let (first, stride) = if self.contiguous { (format!("sg_id * {un}u"), "1u".to_string()) } else { ("sg_id".to_string(), "sg_size".to_string()) };
            b.push_str(&self.k_loop(n, 0, &first, &format!("sg_size * {un}u"), &stride));
            for j in 0..v {
                b.push_str(&format!("    let t{j} = subgroupAdd(acc[{j}]);\n"));
            }
            b.push_str("    if (sg_id == 0u) {\n");
            for i in 0..n {
                for m in 0..mm {
                    let val = if self.rms_scale { format!("t{} * rinv{m}", i * mm + m) } else { format!("t{}", i * mm + m) };
                    let st = self.store(&format!("{m}u"), &format!("p.row0 + r0 + {i}u"), &val);
                    b.push_str(&format!("        if (r0 + {i}u < p.rows) {{ {st} }}\n"));
                }
            }
            b.push_str("    }\n    }\n");
        } else {
            let v = r * mm;
            // With rms_scale the reduction also sums each activation row's sum(x^2) (slots v..).
            let extra = if self.rms_scale { mm } else { 0 };
            let vt = v + extra;
            pre.push_str(&reduce_fn(vt, wg, sg, env));
            let rargs = reduce_args(sg);
            for i in 0..r {
                b.push_str(&format!("    let rb{i} = min(row0 + {i}u, p.rows - 1u) * p.cpr;\n"));
            }
            let (first, stride) = if self.contiguous { (format!("lidx * {un}u"), "1u".to_string()) } else { ("lidx".to_string(), format!("{wg}u")) };
            b.push_str(&self.k_loop(r, extra, &first, &format!("{}u", wg as usize * un), &stride));
            let mut val = "tot".to_string();
            if self.rms_scale {
                pre.push_str(&format!("var<workgroup> rms_inv: array<f32, {mm}>;\n"));
                for m in 0..mm {
                    b.push_str(&format!("    for (var b = lidx; b < p.cpr; b += {wg}u) {{ acc[{}] += xs[{m}u * p.cpr + b].w; }}\n", v + m));
                }
                b.push_str(&format!(
                    "    let tot = wg_reduce_{vt}(acc, {rargs});\n    if (lidx >= {v}u && lidx < {vt}u) {{ rms_inv[lidx - {v}u] = inverseSqrt(tot / f32(p.cpr * 32u) + bitcast<f32>(p.eps)); }}\n    workgroupBarrier();\n"
                ));
                val = "tot * rms_inv[m]".into();
            } else {
                b.push_str(&format!("    let tot = wg_reduce_{v}(acc, {rargs});\n"));
            }
            b.push_str(&format!(
                "    if (lidx < {v}u) {{\n        let row = row0 + lidx / {mm}u;\n        let m = lidx % {mm}u;\n        if (row < p.rows) {{ {} }}\n    }}\n",
                self.store("m", "p.row0 + row", &val)
            ));
        }
        pre.push_str(&self.epilogue.prelude());
        b.push_str(&self.epilogue.body("p.row0 + row0", &format!("min({r}u, p.rows - row0)")));
        let mut kb = KernelBuilder::new(self.name(), *env).workgroup(wg, 1, 1);
        if sg {
            kb = kb.subgroup_builtins();
        }
        kb = kb
            .storage("xq", Access::Read, "array<vec4<u32>>")
            .storage("xs", Access::Read, "array<vec4<f32>>")
            .storage("wv", Access::Read, "array<vec4<u32>>")
            .storage("ws", Access::Read, "array<u32>");
        // The epilogue reads rows other workgroups stored: coherent (module q8_epilogue).
        kb = if self.epilogue.is_some() { kb.storage_coherent("y", "array<f32>") } else { kb.storage("y", Access::ReadWrite, "array<f32>") };
        if self.split_qkv {
            kb = kb.storage("yk", Access::ReadWrite, "array<f32>").storage("yv", Access::ReadWrite, "array<f32>");
        }
        kb = self.epilogue.bind(kb);
        let params: Vec<&str> = PARAMS.iter().copied().chain(["epf"]).collect();
        kb.params(&params).prelude(&pre).body(&b).build()
    }
}

/// The integer-dot GEMV over every part of a matrix (one dispatch per part), reading a
/// [`Q8Activations`] (record that first). Built once; it depends on no step value (its
/// activation rows are the config's).
#[derive(Clone, Debug)]
pub struct Q8GemvPlan {
    plan: Plan,
}

impl Q8GemvPlan {
    /// Validates `cfg`, `w`, the activations (`xa` quantizes at least the config's activation
    /// rows of `w.cols` inputs) and the output(s) ([`GemvOutput::Qkv`] with `cfg.split_qkv`), each
    /// short binding a [`QuantError::BufferTooSmall`] naming it, then builds the dispatches.
    pub fn new(ctx: &GpuContext, cfg: &QuantGemvQ8, w: &QuantMatrix, xa: &Q8Activations, output: &GemvOutput) -> Result<Q8GemvPlan> {
        Self::build(ctx, cfg, w, xa, output, None)
    }

    /// [`Q8GemvPlan::new`] with the config's [`Q8Epilogue`]: the GEMV also quantizes its output
    /// into `target` (scratch from [`Q8Activations::written_by_producer`] of `w.rows` inputs, or
    /// `w.rows / 2` for the GLU), multiplied by `norm_weight` (`w.rows` f32) for
    /// [`Q8Epilogue::Quantize`] with `norm`. `target` must defer the RMSNorm exactly when the
    /// epilogue applies a norm weight. Needs `@coherent` storage and 9 storage bindings per
    /// stage (8 without a norm); one activation row, one part, a [`GemvOutput::Single`] output
    /// and rows per workgroup dividing 32 ([`QuantError::Config`] / [`QuantError::Unsupported`]
    /// otherwise).
    pub fn with_epilogue(
        ctx: &GpuContext,
        cfg: &QuantGemvQ8,
        w: &QuantMatrix,
        xa: &Q8Activations,
        output: &GemvOutput,
        target: &Q8Activations,
        norm_weight: Option<&Binding>,
    ) -> Result<Q8GemvPlan> {
        Self::build(ctx, cfg, w, xa, output, Some((target, norm_weight)))
    }

    /// Whether the adapter runs a GEMV with `epilogue` (`@coherent` storage, enough storage
    /// bindings per stage).
    pub fn epilogue_supported(ctx: &GpuContext, epilogue: Q8Epilogue) -> bool {
        let caps = ctx.capabilities();
        caps.coherent_memory && caps.limits.max_storage_buffers_per_shader_stage as usize >= 5 + epilogue.extra_bindings()
    }

    fn build(
        ctx: &GpuContext,
        cfg: &QuantGemvQ8,
        w: &QuantMatrix,
        xa: &Q8Activations,
        output: &GemvOutput,
        ep: Option<(&Q8Activations, Option<&Binding>)>,
    ) -> Result<Q8GemvPlan> {
        const OP: &str = "gemv_q8";
        if cfg.kind != w.kind() || !QuantGemvQ8::supports(cfg.kind) {
            return Err(QuantError::Shape { what: OP, reason: format!("kernel for {} given {}", cfg.kind.name(), w.kind().name()) });
        }
        w.validate()?;
        let m = cfg.activation_rows as usize;
        if !(1..=8).contains(&m) {
            return Err(QuantError::Shape { what: OP, reason: format!("{m} activation rows (1..=8)") });
        }
        if xa.k() != w.cols || xa.max_rows() < m {
            return Err(QuantError::Shape { what: OP, reason: format!("activations of {} rows x {} for {m} rows x {} inputs", xa.max_rows(), xa.k(), w.cols) });
        }
        let r = cfg.rows_per_workgroup;
        if !(1..=32).contains(&r) || !(1..=8).contains(&cfg.unroll) || (cfg.subgroup_rows > 0 && !r.is_multiple_of(cfg.subgroup_rows)) {
            return Err(QuantError::Config {
                what: OP,
                reason: format!("{r} rows per workgroup in groups of {}, unroll {} (1..=32 rows, 1..=8 unroll)", cfg.subgroup_rows, cfg.unroll),
            });
        }
        let caps = ctx.capabilities();
        let env = env_of(caps);
        // Subgroup-rows mode reduces inside each subgroup; the workgroup reduction needs one
        // invocation per sum.
        let sums = if cfg.per_subgroup(&env) { 1 } else { r * cfg.activation_rows };
        check_threads(OP, caps, cfg.threads, sums)?;
        let cpr = w.chunks_per_row();
        // What the kernel reads of the activations: blocks `m * cpr + c`, `c < cpr`, of the
        // config's rows (xq two vec4 words per block, xs one vec4).
        let blocks = mul("activation blocks", m, cpr)?;
        check_binding(OP, "xq", &xa.xq_binding(), mul("xq words", blocks, 2)?, 16)?;
        check_binding(OP, "xs", &xa.xs_binding(), blocks, 16)?;
        if cfg.accumulate && cfg.split_qkv {
            return Err(QuantError::Config { what: OP, reason: "accumulate with split_qkv".into() });
        }
        let (outputs, qkv) = output.checked(OP, cfg.split_qkv, m, w.rows)?;
        if cfg.rms_scale != xa.deferred_rms().is_some() {
            return Err(QuantError::Config {
                what: OP,
                reason: format!("rms_scale = {} for activations that defer no RMSNorm / defer one (deferred: {:?})", cfg.rms_scale, xa.deferred_rms()),
            });
        }
        let eps = xa.deferred_rms().unwrap_or(0.0);
        let ep_bind = Self::check_epilogue(ctx, cfg, w, output, ep)?;
        let src = cfg.source(&env);
        let src = if cfg.unchecked {
            // SAFETY: the integer-dot GEMV's indices are bounded as follows, by what was
            // validated above.
            // - `xq[(m * cpr + c) * 2 + {0, 1}]` and `xs[m * cpr + c]` with `m < activation_rows`
            //   and `c = min(k, cpr - 1) < cpr` (every chunk index, the prefetched ones included,
            //   is clamped to the row); `xq` holds `2 * activation_rows * cpr` vec4 and `xs`
            //   `activation_rows * cpr` vec4 (checked).
            // - Weight chunk `rb + c` with `rb = min(row0 + r, rows - 1) * cpr` (`rows >= 1`) is
            //   below the part's `rows * cpr` chunks; `w.validate()` checked the part's sections
            //   against its rows and its buffer, so every decoder read is inside it.
            // - Stores: `y[m * n_out + g]`, `g = row0 + row` with `row < rows` tested first, so
            //   `g < N` (with `GemvOutput::Columns`, `g < offset + N <= stride = n_out`, and `y`
            //   holds `activation_rows * stride`, checked); with `split_qkv` `g < nq`, `g - nq < nk`, `g - nq - nk < nv`, `nq + nk +
            //   nv = N`; each output holds `activation_rows` of its rows (checked).
            // - The workgroup reduction: tree indices below `threads * v`; subgroup slots
            //   `sg_idx < min(sg_count, slots)`. Subgroup-rows mode uses no workgroup array.
            //   Every product above fits 32 bits (checked).
            unsafe { src.assume_in_bounds() }
        } else {
            src
        };
        let kernel = ctx.kernel(&src)?;
        let mut plan = Plan::new();
        for part in &w.parts {
            let mut bind = vec![xa.xq_binding(), xa.xs_binding(), part.binding(), part.binding()];
            bind.extend(outputs.iter().cloned());
            bind.extend(ep_bind.iter().cloned());
            let group = ctx.bind(&kernel, &bind)?;
            let grid = grid_for(ctx, part.rows.div_ceil(r as usize))?;
            let d = set_out_cols(set_part(PlanDispatch::new(&kernel, group, grid)?, w, part)?, part, out_cols(output, w.rows))?
                .set_usize("nq", qkv[0])?
                .set_usize("nk", qkv[1])?
                .set_usize("nv", qkv[2])?
                .set_f32("eps", eps)?
                .set_usize("epf", w.rows / 2)?;
            plan.push(d);
        }
        Ok(Q8GemvPlan { plan })
    }

    /// Checks the epilogue against the config, the matrix and the adapter, and returns its
    /// bindings (`cnt`, zeroed, then the target's `xq`/`xs`, then the norm weight).
    fn check_epilogue(
        ctx: &GpuContext,
        cfg: &QuantGemvQ8,
        w: &QuantMatrix,
        output: &GemvOutput,
        ep: Option<(&Q8Activations, Option<&Binding>)>,
    ) -> Result<Vec<Binding>> {
        const OP: &str = "gemv_q8 epilogue";
        let config = |reason: String| QuantError::Config { what: OP, reason };
        let Some((target, norm)) = ep else {
            return if cfg.epilogue.is_some() { Err(config("the config has an epilogue: build with Q8GemvPlan::with_epilogue".into())) } else { Ok(vec![]) };
        };
        if !cfg.epilogue.is_some() {
            return Err(config("an epilogue target for a config without an epilogue".into()));
        }
        if !Self::epilogue_supported(ctx, cfg.epilogue) {
            return Err(QuantError::Unsupported {
                name: w.name.clone(),
                reason: format!("a GEMV epilogue needs @coherent storage and {} storage bindings per stage", 5 + cfg.epilogue.extra_bindings()),
            });
        }
        let r = cfg.rows_per_workgroup;
        if cfg.activation_rows != 1 || cfg.split_qkv || w.parts.len() != 1 || !matches!(output, GemvOutput::Single(_)) || !32u32.is_multiple_of(r) {
            return Err(config(format!(
                "an epilogue needs one activation row ({}), one part ({}), a single output and rows per workgroup dividing 32 ({r})",
                cfg.activation_rows,
                w.parts.len()
            )));
        }
        let glu = matches!(cfg.epilogue, Q8Epilogue::Glu { .. });
        let k = if glu { w.rows / 2 } else { w.rows };
        if !w.rows.is_multiple_of(cfg.epilogue.block_rows() as usize) || target.k() != k || target.max_rows() != 1 {
            return Err(QuantError::Shape { what: OP, reason: format!("{} output rows into activations of {} x {}", w.rows, target.max_rows(), target.k()) });
        }
        if cfg.epilogue.has_norm() != norm.is_some() || target.deferred_rms().is_some() != cfg.epilogue.has_norm() {
            return Err(config(format!(
                "epilogue {:?} with a norm weight: {}, into activations deferring an RMSNorm: {}",
                cfg.epilogue,
                norm.is_some(),
                target.deferred_rms().is_some()
            )));
        }
        let blocks = k / 32;
        let cnt = ctx.alloc(4 * blocks as u64, BufferKind::Storage)?;
        ctx.write(&cnt, 0, &vec![0u8; 4 * blocks])?;
        let mut b = vec![Binding::whole(&cnt), target.xq_binding(), target.xs_binding()];
        if let Some(nw) = norm {
            check_binding(OP, "norm weight", nw, k, 4)?;
            b.push(nw.clone());
        }
        Ok(b)
    }

    /// The fused Q/K/V projection: `w` holds Q, K and V rows (`rows[0] + rows[1] + rows[2]`),
    /// written to `outputs` (`m x rows[i]` f32 each); `cfg.split_qkv` must be set. The same as
    /// [`Q8GemvPlan::new`] with [`GemvOutput::Qkv`].
    pub fn new_qkv(ctx: &GpuContext, cfg: &QuantGemvQ8, w: &QuantMatrix, xa: &Q8Activations, outputs: [&Binding; 3], rows: [usize; 3]) -> Result<Q8GemvPlan> {
        let [q, k, v] = outputs.map(|b| b.clone());
        Self::new(ctx, cfg, w, xa, &GemvOutput::Qkv { q, k, v, rows })
    }

    /// The dispatches, for an engine to append to its own plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Records the GEMV dispatches (one per part); record the [`Q8Activations`] first.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        Ok(self.plan.record(rec, step)?)
    }

    /// Records into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &GpuContext, step: &StepValues) -> Result<()> {
        Ok(self.plan.run(ctx, step)?)
    }
}
