//! The cooperative-matrix GEMM kernel (f16 16x16x16 tiles, f32 accumulate), generated from a
//! typed [`CoopTiles`] configuration.
//!
//! One workgroup computes a `bm x bn` output block (`bm` activation rows, `bn` weight rows)
//! with `sg_m x sg_n` subgroups of 32; each subgroup owns a `(bm / sg_m) x (bn / sg_n)` block of
//! 16x16 accumulators that live in `coop_mat` variables for the whole K loop. K advances in
//! steps of `bk` (a multiple of 32): each step stages the activations (`f32` -> `f16`) and the
//! weights (dequantized once per workgroup with the format's `dqf`, stored as `f16`) in
//! workgroup memory as `vec4<f16>` (one store per 4 values; the cooperative loads count offsets
//! and strides in those units), rows padded by `pad` halves against bank
//! conflicts, then runs `bk / 16`
//! multiply-add sub-steps per barrier. Each invocation's share of a step is first loaded (and
//! decoded) into registers; with `prefetch` the next step's share is loaded right after the
//! barrier that publishes the current tiles, so its memory latency overlaps the multiply-adds.
//!
//! Layout and naga 30's column-major `coopLoad`: activations are stored `[m][k]` and loaded with
//! `coopLoadT` (row-major A); weights are stored `[n][k]`, which is Wᵀ (`K x N`) column-major,
//! and loaded with `coopLoad`. Results go row-major with `coopStoreT`: straight to `y` when the
//! whole block is in bounds, else through a per-subgroup 16x16 scratch with bounds checks (so M
//! and N need not be multiples of the block). Indices in pointer arguments are bound with `let`
//! (naga 30's SPIR-V writer panics otherwise).
//!
//! Subgroups are placed by the `subgroup_id` builtin (`sg_idx`, lanes by `sg_id`), never by
//! `lidx / 32`: each subgroup's cooperative loads and stores must be made by its own lanes.
//!
//! In bounds by construction given valid bindings (so the validated [`super::GemmPlan`] may drop
//! naga's checks): activation rows are clamped to `m - 1`, weight rows to `rows - 1`, and K-step
//! chunks past the row to its last chunk with the activations zeroed there.

use std::fmt::Write;

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use crate::quant::decode::decoder;
use crate::quant::kernel_common::PARAMS;
use crate::quant::{QuantError, Result, WeightKind};

/// Block shape of the cooperative-matrix GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTiles {
    /// Activation rows per workgroup.
    pub bm: u32,
    /// Weight rows (output columns) per workgroup.
    pub bn: u32,
    /// K elements per barrier step (multiple of 32).
    pub bk: u32,
    /// Subgroups along M (workgroup = 32 * sg_m * sg_n invocations).
    pub sg_m: u32,
    /// Subgroups along N.
    pub sg_n: u32,
    /// Padding of each staged row, in f16 elements (multiple of 8 keeps rows 16-byte aligned).
    pub pad: u32,
    /// Load (and decode) the next K step's activations and weights into registers before the
    /// current step's multiply-adds, so global memory latency overlaps the tensor-core work.
    pub prefetch: bool,
}

impl std::fmt::Display for CoopTiles {
    /// In words, for error messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self;
        write!(f, "tiles of {} x {} outputs, {} K per step, {} x {} subgroups, padding {}", t.bm, t.bn, t.bk, t.sg_m, t.sg_n, t.pad)
    }
}

impl CoopTiles {
    /// The default block: 128x128, K steps of 64, 8 subgroups of 64x32 (4x2 accumulators), the
    /// next step's tiles prefetched into registers. On the H200 at M = 512 (2026-12-02, `cargo
    /// xtask bench --kernels --only gemm`): 137-176 TFLOP/s across formats at N = K = 4096, and
    /// the best of every candidate at each of Llama-3-8B's four prefill shapes (128 TFLOP/s at
    /// QKV's 6144 outputs, whose 192 blocks fill 132 compute units unevenly, 162-176 at the
    /// others).
    pub const DEFAULT: CoopTiles = CoopTiles { bm: 128, bn: 128, bk: 64, sg_m: 2, sg_n: 4, pad: 8, prefetch: true };

    /// Block shapes for steps of few rows, `(most rows, tiles)` in increasing order; steps of more
    /// rows than the last take [`CoopTiles::DEFAULT`]. A 128-row block pads a step of 64 rows
    /// or fewer, and its 128-wide columns leave most of the GPU idle: on the H100 (2026-12-07,
    /// `cargo xtask bench --kernels --only rows`, Llama-3-8B's four projections summed, Q4_0 /
    /// Q4_K) the default takes 761 / 786 us at 64 rows, these 369 / 417 us at 16 rows, 430 /
    /// 480 at 32 and 520 / 535 at 64. Every shape accumulates each output over K in the same
    /// order (16 at a time, from 0 up), so a row's result does not depend on the band.
    pub const ROW_BANDS: [(u32, CoopTiles); 3] = [
        (16, CoopTiles { bm: 16, bn: 32, bk: 128, sg_m: 1, sg_n: 2, pad: 8, prefetch: true }),
        (32, CoopTiles { bm: 32, bn: 32, bk: 128, sg_m: 1, sg_n: 2, pad: 8, prefetch: true }),
        (64, CoopTiles { bm: 64, bn: 64, bk: 64, sg_m: 2, sg_n: 2, pad: 8, prefetch: true }),
    ];

    /// The row bands of a GEMM split over K ([`super::GemmPlan::with_split_k_sum`]): the
    /// split gives the small-N projections the workgroups the narrow 32-row block gave them, so
    /// 17 to 64 rows take the 64x64x64 block. On the H100 (2026-12-07, `cargo xtask bench
    /// --kernels --only rows`, Q4_0, Llama-3-8B's four projections at 32 rows, each at the
    /// split `row_band_splits` gives it): 306 us a layer against 342 with the 32x32x128 block;
    /// gate/up, unsplit, 155 against 180.
    pub const SPLIT_ROW_BANDS: [(u32, CoopTiles); 2] = [Self::ROW_BANDS[0], Self::ROW_BANDS[2]];

    /// The bands of a GEMM of at most `max_m` rows on an adapter of `max_shared` bytes of
    /// workgroup memory: `(tiles, lo, hi)` for steps of `lo < m <= hi` rows, from
    /// [`CoopTiles::ROW_BANDS`] (a shape the adapter cannot hold leaves its rows to the next
    /// band), then [`CoopTiles::DEFAULT`] for the rest; none past `max_m`.
    pub fn bands(max_m: u32, max_shared: u32) -> Vec<(CoopTiles, u32, u32)> {
        Self::bands_of(&Self::ROW_BANDS, max_m, max_shared)
    }

    /// [`CoopTiles::bands`] from another table of `(most rows, tiles)` in increasing order.
    pub fn bands_of(table: &[(u32, CoopTiles)], max_m: u32, max_shared: u32) -> Vec<(CoopTiles, u32, u32)> {
        let mut v = Vec::new();
        let mut lo = 0;
        for &(hi, t) in table {
            if lo >= max_m {
                break;
            }
            if t.valid(max_shared) {
                v.push((t, lo, hi));
                lo = hi;
            }
        }
        if lo < max_m {
            v.push((Self::DEFAULT, lo, u32::MAX));
        }
        v
    }

    /// Shapes worth comparing in benchmarks (all valid within 48 KiB): prefetching blocks from
    /// 64x64 to 256x128 with 32x32 to 64x64 outputs per subgroup, and the default without the
    /// prefetch.
    pub fn candidates() -> Vec<CoopTiles> {
        let pf = |bm, bn, bk, sg_m, sg_n| CoopTiles { bm, bn, bk, sg_m, sg_n, pad: 8, prefetch: true };
        vec![
            CoopTiles::DEFAULT,
            CoopTiles { prefetch: false, ..CoopTiles::DEFAULT },
            pf(128, 128, 64, 4, 2),
            pf(128, 128, 32, 2, 4),
            pf(64, 128, 64, 2, 4),
            pf(64, 128, 64, 1, 4),
            pf(64, 128, 32, 2, 4),
            pf(128, 64, 64, 4, 2),
            pf(128, 64, 64, 2, 2),
            pf(64, 64, 64, 2, 2),
            pf(64, 64, 128, 2, 2),
            pf(128, 256, 32, 2, 8),
            // 64x64 per subgroup (4x4 accumulators): 8 cooperative loads per 16 multiply-adds
            // where 64x32 needs 6 per 8.
            pf(128, 128, 32, 2, 2),
            pf(256, 128, 32, 4, 2),
            pf(128, 256, 32, 2, 4),
            pf(64, 128, 32, 1, 2),
        ]
    }

    fn wg(&self) -> u32 {
        32 * self.sg_m * self.sg_n
    }

    /// Accumulator tiles per subgroup along M and N.
    fn frags(&self) -> (u32, u32) {
        (self.bm / self.sg_m / 16, self.bn / self.sg_n / 16)
    }

    /// Workgroup memory in bytes (saturating: a shape too large for any adapter reads as
    /// `u64::MAX`).
    pub fn shared_bytes(&self) -> u64 {
        let (bm, bn, bk, pad, sm, sn) = (self.bm as u128, self.bn as u128, self.bk as u128, self.pad as u128, self.sg_m as u128, self.sg_n as u128);
        u64::try_from(2 * (bm + bn) * (bk + pad) + 4 * 256 * sm * sn).unwrap_or(u64::MAX)
    }

    /// Whether the shape is well formed and fits `max_shared` bytes of workgroup memory (no
    /// arithmetic in it can overflow, whatever the fields hold).
    pub fn valid(&self, max_shared: u32) -> bool {
        // At most 32 subgroups of 32 (1024 invocations) bounds every product below.
        if self.sg_m == 0 || self.sg_n == 0 || self.sg_m > 32 || self.sg_n > 32 || self.sg_m * self.sg_n > 32 {
            return false;
        }
        let (fm, fn_) = (self.bm / self.sg_m / 16, self.bn / self.sg_n / 16);
        self.bk.is_multiple_of(32)
            && self.bk > 0
            && self.pad.is_multiple_of(8)
            && self.bm.is_multiple_of(16 * self.sg_m)
            && self.bn.is_multiple_of(16 * self.sg_n)
            && fm > 0
            && fn_ > 0
            && self.shared_bytes() <= max_shared as u64
    }
}

/// Workgroup memory no adapter exceeds; larger shapes are refused before any WGSL is generated.
const MAX_SHARED_ANY: u32 = 1 << 20;

/// The WGSL kernel for `kind` with block shape `t` (compiled with bounds checks), reading f16
/// activations with `x_f16`, else f32 ones (rounded to f16 as they are staged). Errors with
/// [`QuantError::Config`] when `t` is not well formed ([`CoopTiles::valid`] with up to 1 MiB of
/// workgroup memory; the plan checks the adapter's own limit) or `env` lacks f16 or subgroups.
pub fn coop_source(kind: WeightKind, t: &CoopTiles, x_f16: bool, env: &KernelEnv) -> Result<KernelSource> {
    if !t.valid(MAX_SHARED_ANY) {
        return Err(QuantError::Config { what: "coopmat tiles", reason: format!("{t} are not well formed (or need over 1 MiB of workgroup memory)") });
    }
    if !(env.f16 && env.subgroups) {
        return Err(QuantError::Config { what: "coopmat GEMM", reason: "needs f16 and subgroups".into() });
    }
    let (fm, fn_) = t.frags();
    let (wg, s) = (t.wg(), t.bk + t.pad);
    let (tm, tn) = (t.bm / t.sg_m, t.bn / t.sg_n);
    let name = format!(
        "quant_gemm_{}_coop{}x{}x{}_{}x{}{}{}",
        kind.name().to_lowercase(),
        t.bm,
        t.bn,
        t.bk,
        t.sg_m,
        t.sg_n,
        if t.prefetch { "_pf" } else { "" },
        if x_f16 { "_xh" } else { "" }
    );
    // Activations as loaded and held in registers until staged.
    let xt = if x_f16 { "vec4<f16>" } else { "vec4<f32>" };
    let mut pre = decoder(kind);
    // Staged rows as vec4<f16>: one store per 4 values, and the cooperative loads count offsets
    // and strides in those units.
    let s4 = s / 4;
    let _ = write!(
        pre,
        "var<workgroup> As: array<vec4<f16>, {}>;\nvar<workgroup> Ws: array<vec4<f16>, {}>;\nvar<workgroup> Cs: array<f32, {}>;\n",
        t.bm * s4,
        t.bn * s4,
        256 * t.sg_m * t.sg_n
    );
    let cpk = t.bk / 32; // chunks per K step
    let xv4 = t.bm * t.bk / 4; // activation vec4s per step
    let wch = t.bn * cpk; // weight chunks per step
    let mut b = String::new();
    let _ = write!(
        b,
        "    let n0 = wid.x * {bn}u;
    let m0 = wid.y * {bm}u;
    let sgi = sg_idx;
    let lane = sg_id;
    let sm = (sgi / {sg_n}u) * {tm}u;
    let sn = (sgi % {sg_n}u) * {tn}u;
    let nsteps = (p.cpr + {cpk}u - 1u) / {cpk}u;
    // Split `wid.z` over K: steps `ks_lo .. ks_hi` (`ks_per` each; 0: every step), stored
    // `split_off` elements further on per split.
    let ks_lo = min(wid.z * p.ks_per, nsteps);
    let ks_hi = select(nsteps, min(ks_lo + p.ks_per, nsteps), p.ks_per > 0u);
    let yo = wid.z * p.split_off;
",
        bn = t.bn,
        bm = t.bm,
        sg_n = t.sg_n,
    );
    for i in 0..fm {
        for j in 0..fn_ {
            let _ = writeln!(b, "    var c{i}_{j} = coop_mat16x16<f32, C>();");
        }
    }
    let xper = xv4.div_ceil(wg);
    let wper = wch.div_ceil(wg);
    let q = t.bk / 4;
    let xguard = if !xv4.is_multiple_of(wg) { format!("idx < {xv4}u && ") } else { String::new() };
    // Global loads of step `ks` into registers: activations as stored (`xr{i}`), weights decoded
    // (`wr{i}`).
    let mut load = String::new();
    for i in 0..xper {
        let _ = write!(
            load,
            "        {{
            let idx = lidx + {i}u * {wg}u;
            let gm = min(m0 + idx / {q}u, p.m - 1u);
            let kv = KS * {q}u + idx % {q}u;
            xr{i} = {xt}(0.0);
            if ({xguard}kv < p.k4) {{ xr{i} = x[gm * p.k4 + kv]; }}
        }}
"
        );
    }
    for i in 0..wper {
        let _ = write!(
            load,
            "        {{
            let idx = min(lidx + {i}u * {wg}u, {}u);
            let row = min(n0 + idx / {cpk}u, p.rows - 1u);
            let kc = min(KS * {cpk}u + idx % {cpk}u, p.cpr - 1u);
            wr{i} = dqf(row * p.cpr + kc);
        }}
",
            wch - 1
        );
    }
    // Registers to workgroup memory (f16).
    let mut store = String::new();
    for i in 0..xper {
        let open = if !xv4.is_multiple_of(wg) { format!("if (lidx + {i}u * {wg}u < {xv4}u) ") } else { String::new() };
        let _ = write!(
            store,
            "        {open}{{
            let idx = lidx + {i}u * {wg}u;
            As[(idx / {q}u) * {s4}u + idx % {q}u] = vec4<f16>(xr{i});
        }}
"
        );
    }
    for i in 0..wper {
        let open = if !wch.is_multiple_of(wg) { format!("if (lidx + {i}u * {wg}u < {wch}u) ") } else { String::new() };
        // Unrolled: constant indices keep `wr` in registers.
        let _ = write!(store, "        {open}{{\n            let o = ((lidx + {i}u * {wg}u) / {cpk}u) * {s4}u + ((lidx + {i}u * {wg}u) % {cpk}u) * 8u;\n");
        for e in 0..8 {
            let _ = writeln!(store, "            Ws[o + {e}u] = vec4<f16>(wr{i}[{e}]);");
        }
        store.push_str("        }\n");
    }
    for i in 0..xper {
        let _ = writeln!(b, "    var xr{i}: {xt};");
    }
    for i in 0..wper {
        let _ = writeln!(b, "    var wr{i}: array<vec4<f32>, 8>;");
    }
    if t.prefetch {
        b.push_str(&load.replace("KS", "ks_lo"));
        b.push_str("    for (var ks = ks_lo; ks < ks_hi; ks++) {\n");
        b.push_str(&store);
        b.push_str("        workgroupBarrier();\n        if (ks + 1u < ks_hi) {\n");
        b.push_str(&load.replace("KS", "(ks + 1u)"));
        b.push_str("        }\n");
    } else {
        b.push_str("    for (var ks = ks_lo; ks < ks_hi; ks++) {\n");
        b.push_str(&load.replace("KS", "ks"));
        b.push_str(&store);
        b.push_str("        workgroupBarrier();\n");
    }
    // Multiply-add sub-steps.
    let _ = writeln!(b, "        for (var kk = 0u; kk < {}u; kk += 16u) {{", t.bk);
    for i in 0..fm {
        let _ = writeln!(b, "            let ia{i} = (sm + {}u) * {s4}u + kk / 4u;", 16 * i);
        let _ = writeln!(b, "            let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&As[ia{i}], {s4}u);");
    }
    for j in 0..fn_ {
        let _ = writeln!(b, "            let ib{j} = (sn + {}u) * {s4}u + kk / 4u;", 16 * j);
        let _ = writeln!(b, "            let b{j} = coopLoad<coop_mat16x16<f16, B>>(&Ws[ib{j}], {s4}u);");
    }
    for i in 0..fm {
        for j in 0..fn_ {
            let _ = writeln!(b, "            c{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c{i}_{j});");
        }
    }
    b.push_str("        }\n        workgroupBarrier();\n    }\n");
    // Epilogue: direct row-major stores when the block is in bounds, else via scratch.
    let _ = write!(b, "    if (m0 + {}u <= p.m && n0 + {}u <= p.rows) {{\n        let ny = p.n_out;\n", t.bm, t.bn);
    for i in 0..fm {
        for j in 0..fn_ {
            let _ = writeln!(b, "        let iy{i}_{j} = yo + (m0 + sm + {}u) * p.n_out + p.row0 + n0 + sn + {}u;", 16 * i, 16 * j);
            let _ = writeln!(b, "        coopStoreT(c{i}_{j}, &y[iy{i}_{j}], ny);");
        }
    }
    b.push_str("    } else {\n        let cs = sgi * 256u;\n");
    for i in 0..fm {
        for j in 0..fn_ {
            let _ = write!(
                b,
                "        coopStoreT(c{i}_{j}, &Cs[cs], 16u);
        workgroupBarrier();
        for (var t = 0u; t < 8u; t++) {{
            let e = lane + t * 32u;
            let gm = m0 + sm + {mi}u + (e >> 4u);
            let gn = n0 + sn + {nj}u + (e & 15u);
            if (gm < p.m && gn < p.rows) {{ y[yo + gm * p.n_out + p.row0 + gn] = Cs[cs + e]; }}
        }}
        workgroupBarrier();
",
                mi = 16 * i,
                nj = 16 * j,
            );
        }
    }
    b.push_str("    }\n");
    Ok(KernelBuilder::new(name, *env)
        .enable_f16()
        .enable("wgpu_cooperative_matrix")
        .workgroup(wg, 1, 1)
        .subgroup_builtins()
        .prelude(&pre)
        .body(&b)
        .storage("x", Access::Read, if x_f16 { "array<vec4<f16>>" } else { "array<vec4<f32>>" })
        .storage("wv", Access::Read, "array<vec4<u32>>")
        .storage("ws", Access::Read, "array<u32>")
        .storage("y", Access::ReadWrite, "array<f32>")
        .params(&PARAMS.iter().copied().chain(["ks_per", "split_off"]).collect::<Vec<_>>())
        .build())
}
