//! [`QuantGemvQ8`]: the integer-dot GEMV (decode), `y[m][n] = sum_k x[m][k] * W[n][k]` for
//! 1..=8 activation rows, with the activations quantized to int8 per 32-element block first.
//!
//! Two dispatches, recorded together by [`super::Q8GemvPlan`]:
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
//! never by `lidx / sg_size`. `unchecked` is honoured by [`super::Q8GemvPlan`] once it has validated
//! every binding; [`QuantGemvQ8::source`] is always compiled with bounds checks.

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::WeightKind;
use super::decode::{decoder, is_quantized};
use super::kernel_common::{PARAMS, reduce_args, reduce_fn};
use super::q8_epilogue::Q8Epilogue;

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
    /// Row groups (of `rows_per_workgroup` rows) per workgroup, taken one after the other at a
    /// stride of the grid (`wg, wg + n_wg, ...`): fewer workgroups per dispatch, each launched
    /// once (1: one group per workgroup).
    pub row_groups: u32,
    /// Rotate the Q/K rows and store K/V into the cache ([`super::rope_kv`]; build with
    /// [`super::Q8GemvPlan::with_rope_kv`]).
    pub rope_kv: bool,
    /// Compile without naga's bounds checks: honoured only by [`super::Q8GemvPlan`], once it has validated
    /// every binding; the config's own `source` is always checked.
    pub unchecked: bool,
    /// The activation rows are a step's first `p.m` rows (a per-step parameter; built with
    /// [`super::Q8GemvPlan::decode_rows`]), taken `activation_rows` at a time in a loop inside
    /// the workgroup, so its weight rows come from memory once for all of them; rows past `p.m`
    /// read row `p.m - 1` and store nothing. The workgroup splits K (no `subgroup_rows`), with
    /// no epilogue, `rms_scale`, `split_qkv`, `rope_kv` or row groups.
    pub step_rows: bool,
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
            row_groups: 1,
            rope_kv: false,
            unchecked: false,
            step_rows: false,
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
                v.push(QuantGemvQ8 { row_groups: 4, ..base });
                v.push(QuantGemvQ8 { step_rows: true, ..base });
                v.push(QuantGemvQ8 { step_rows: true, accumulate: true, unroll: 2, rows_per_workgroup: 4, threads: 128, ..base });
                if m == 1 {
                    v.push(QuantGemvQ8 { row_groups: 3, rms_scale: true, epilogue: Q8Epilogue::Glu { act: crate::act::ActKind::Silu }, ..base });
                    v.push(QuantGemvQ8 { rope_kv: true, rms_scale: true, rows_per_workgroup: 2, ..base });
                    v.push(QuantGemvQ8 { rope_kv: true, subgroup_rows: 2, rows_per_workgroup: 8, threads: 128, ..base });
                    // Workgroup-local blocks (no coherent storage needed).
                    for (norm, gemma) in [(true, false), (true, true), (false, false)] {
                        let epilogue = Q8Epilogue::QuantizeLocal { norm, gemma };
                        v.push(QuantGemvQ8 { epilogue, accumulate: true, rows_per_workgroup: 32, threads: 32, ..base });
                        v.push(QuantGemvQ8 { epilogue, accumulate: true, rows_per_workgroup: 64, threads: 512, subgroup_rows: 2, ..base });
                        v.push(QuantGemvQ8 { epilogue, rms_scale: true, rows_per_workgroup: 32, threads: 128, subgroup_rows: 1, row_groups: 2, ..base });
                    }
                    for act in [crate::act::ActKind::Silu, crate::act::ActKind::GeluTanh] {
                        let epilogue = Q8Epilogue::GluLocal { act };
                        v.push(QuantGemvQ8 { epilogue, rows_per_workgroup: 64, threads: 64, ..base });
                        v.push(QuantGemvQ8 { epilogue, rms_scale: true, rows_per_workgroup: 128, threads: 256, subgroup_rows: 2, ..base });
                        v.push(QuantGemvQ8 { epilogue, rms_scale: true, rows_per_workgroup: 64, threads: 128, subgroup_rows: 1, row_groups: 2, ..base });
                    }
                }
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
            "quant_gemv_q8_{}_r{}_t{}_u{}{}{}_m{}{}{}{}{}{}{}{}{}",
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
            if self.rope_kv { "_ropekv" } else { "" },
            if self.row_groups > 1 { format!("_g{}", self.row_groups) } else { String::new() },
            if self.step_rows { "_steprows" } else { "" },
        )
    }

    /// Whether the kernel runs in subgroup-rows mode on `env`.
    pub(crate) fn per_subgroup(&self, env: &KernelEnv) -> bool {
        self.subgroups && env.subgroups && self.subgroup_rows > 0 && !self.step_rows
    }

    /// The WGSL activation row of local activation row `m` (with `step_rows`, the loop's row,
    /// clamped to the step's last).
    fn x_row(&self, m: usize) -> String {
        if self.step_rows { format!("xr{m}") } else { format!("{m}u") }
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
                let xr = self.x_row(m);
                b.push_str(&format!(
                    "        let xa{m}_{u} = xq[({xr} * p.cpr + c{u}) * 2u];\n        let xb{m}_{u} = xq[({xr} * p.cpr + c{u}) * 2u + 1u];\n        let xs{m}_{u} = select(vec4<f32>(0.0), xs[{xr} * p.cpr + c{u}], ok{u});\n"
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

    /// Whether workgroups own whole GLU blocks ([`Q8Epilogue::GluLocal`]).
    fn glu_local(&self) -> bool {
        matches!(self.epilogue, Q8Epilogue::GluLocal { .. })
    }

    /// The WGSL weight row of local row `l` (an expression) of the workgroup at `row0`, clamped
    /// to the matrix (with [`Q8Epilogue::GluLocal`] the plan checked that every workgroup's
    /// rows exist).
    fn phys(&self, l: &str) -> String {
        if self.glu_local() { format!("prow(row0, {l})") } else { format!("min(row0 + {l}, p.rows - 1u)") }
    }

    /// The WGSL statement storing `val` at output row `g` of one activation row and keeping the
    /// stored value (with `accumulate`, the sum) at `gl_v[l]` for a local epilogue.
    fn store_local(&self, g: &str, val: &str, l: &str) -> String {
        if self.accumulate {
            format!("let o = {g}; let nv = y[o] + {val}; y[o] = nv; gl_v[{l}] = nv;")
        } else {
            format!("let nv = {val}; y[{g}] = nv; gl_v[{l}] = nv;")
        }
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

    /// The WGSL source for `env` (compiled with bounds checks; see [`super::Q8GemvPlan`] for
    /// `unchecked`).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let r = self.rows_per_workgroup as usize;
        let mm = self.activation_rows as usize;
        let (wg, un) = (self.threads, self.unroll as usize);
        let sg = self.subgroups && env.subgroups;
        let mut pre = decoder(self.kind);
        let groups = self.row_groups > 1;
        let mut b = if groups {
            // Uniform per workgroup: the loop bounds depend on the workgroup and parameters only.
            format!(
                "    if (wg_linear >= p.n_wg) {{ return; }}\n    for (var rgi = 0u; rgi < {}u; rgi++) {{\n    let row0 = (wg_linear + rgi * p.n_wg) * {r}u;\n    if (row0 >= p.rows) {{ break; }}\n",
                self.row_groups
            )
        } else {
            format!("    let row0 = wg_linear * {r}u;\n    if (row0 >= p.rows) {{ return; }}\n")
        };
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
                b.push_str(&format!("    let rb{i} = {} * p.cpr;\n", self.phys(&format!("rr + {i}u"))));
            }
            let (first, stride) = if self.contiguous { (format!("sg_id * {un}u"), "1u".to_string()) } else { ("sg_id".to_string(), "sg_size".to_string()) };
            b.push_str(&self.k_loop(n, 0, &first, &format!("sg_size * {un}u"), &stride));
            for j in 0..v {
                b.push_str(&format!("    let t{j} = subgroupAdd(acc[{j}]);\n"));
            }
            b.push_str("    if (sg_id == 0u) {\n");
            let val = |j: usize, m: usize| if self.rms_scale { format!("t{j} * rinv{m}") } else { format!("t{j}") };
            if self.rope_kv {
                pre.push_str(&super::rope_kv::prelude(None));
                for i in (0..n).step_by(2) {
                    b.push_str(&format!("        if (r0 + {i}u < p.rows) {{ rope_kv(p.row0 + r0 + {i}u, {}, {}); }}\n", val(i, 0), val(i + 1, 0)));
                }
            }
            for i in (0..n).filter(|_| !self.rope_kv) {
                for m in 0..mm {
                    let g = format!("p.row0 + {}", self.phys(&format!("rr + {i}u")));
                    let st = if self.epilogue.is_local() {
                        self.store_local(&g, &val(i * mm + m, m), &format!("rr + {i}u"))
                    } else {
                        self.store(&format!("{m}u"), &g, &val(i * mm + m, m))
                    };
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
                b.push_str(&format!("    let rb{i} = {} * p.cpr;\n", self.phys(&format!("{i}u"))));
            }
            let (first, stride) = if self.contiguous { (format!("lidx * {un}u"), "1u".to_string()) } else { ("lidx".to_string(), format!("{wg}u")) };
            if self.step_rows {
                // Once per group of `mm` of the step's rows (uniform: `p.m` is a parameter).
                b.push_str(&format!("    for (var g0 = 0u; g0 < p.m; g0 += {mm}u) {{\n"));
                for m in 0..mm {
                    b.push_str(&format!("    let xr{m} = min(g0 + {m}u, p.m - 1u);\n"));
                }
            }
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
            if self.rope_kv {
                pre.push_str(&super::rope_kv::prelude(Some(v)));
                b.push_str(&super::rope_kv::store_reduced(v, &val.replace("[m]", "[0]")));
            } else if self.epilogue.is_local() {
                // One activation row (checked by the plan): local row `lidx`, stored at its
                // physical row and kept in workgroup memory for the epilogue.
                let g = format!("p.row0 + {}", self.phys("lidx"));
                b.push_str(&format!("    if (lidx < {v}u) {{\n        {}\n    }}\n", self.store_local(&g, &val.replace("[m]", "[0]"), "lidx")));
            } else if self.step_rows {
                b.push_str(&format!(
                    "    if (lidx < {v}u) {{\n        let row = row0 + lidx / {mm}u;\n        let m = g0 + lidx % {mm}u;\n        if (row < p.rows && m < p.m) {{ {} }}\n    }}\n    }}\n",
                    self.store("m", "p.row0 + row", &val)
                ));
            } else {
                b.push_str(&format!(
                "    if (lidx < {v}u) {{\n        let row = row0 + lidx / {mm}u;\n        let m = lidx % {mm}u;\n        if (row < p.rows) {{ {} }}\n    }}\n",
                    self.store("m", "p.row0 + row", &val)
                ));
            }
        }
        pre.push_str(&self.epilogue.prelude(self.rows_per_workgroup));
        if self.glu_local() {
            // Local row `l` of the workgroup at virtual row `row0`: gate rows of outputs
            // `row0 / 2 ..` in the first half, the up rows of the same outputs in the second.
            pre.push_str(&format!(
                "fn prow(row0: u32, l: u32) -> u32 {{\n    let h = {}u;\n    return select(p.epf + row0 / 2u + l - h, row0 / 2u + l, l < h);\n}}\n",
                r / 2
            ));
        }
        b.push_str(&self.epilogue.body("p.row0 + row0", &format!("min({r}u, p.rows - row0)"), self.rows_per_workgroup));
        if groups {
            b.push_str("    }\n");
        }
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
        kb = if self.epilogue.uses_arrivals() { kb.storage_coherent("y", "array<f32>") } else { kb.storage("y", Access::ReadWrite, "array<f32>") };
        if self.split_qkv {
            kb = kb.storage("yk", Access::ReadWrite, "array<f32>").storage("yv", Access::ReadWrite, "array<f32>");
        }
        kb = self.epilogue.bind(kb);
        if self.rope_kv {
            kb = super::rope_kv::bind(kb);
        }
        let rope_params = if self.rope_kv { super::rope_kv::PARAMS } else { &[] };
        let group_params: &[&str] = if groups { &["n_wg"] } else { &[] };
        let params: Vec<&str> = PARAMS.iter().chain(["epf"].iter()).chain(rope_params).chain(group_params).copied().collect();
        kb.params(&params).prelude(&pre).body(&b).build()
    }
}
