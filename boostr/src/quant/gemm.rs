//! [`QuantGemm`]: `Y[m][n] = sum_k X[m][k] * W[n][k]` for many activation rows (prefill).
//!
//! - Tiled (any adapter): K in steps of one 32-element chunk; activations and the tile's weight
//!   rows (dequantized with the format's shared decoder, [`super::decode`], `dqf`) are staged in
//!   workgroup memory as f32; a 64x64 output tile per 256 invocations, 4x4 outputs each.
//! - Cooperative matrix (`coopmat`, f16 16x16x16 with f32 accumulate): [`coopmat`] (file
//!   `gemm_coopmat.rs`), a typed block shape [`CoopTiles`] (default 128x128 per workgroup, K steps
//!   of 64, 8 subgroups each holding 4x2 accumulators for the whole K loop, f16 staging, the
//!   next K step prefetched into registers).
//!
//! [`GemmPlan`] is built for at most `max_m` activation rows; a recording computes the step's
//! `n_tok` rows (`p.m` and the grid follow the step; rows past it are neither read nor written).

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, Recorder, StepValues};

use super::decode::decoder;
#[path = "gemm_coopmat.rs"]
pub mod coopmat;
use super::gemv_output::{GemvOutput, out_cols};
use super::kernel_common::PARAMS;
use super::part_plan::PartKernel;
use super::split_sum::SplitSumPlan;
use super::validate::{check_binding, check_step, env_of, mul, step_rows, to_u32};
use super::{QuantError, QuantMatrix, Result, WeightKind};
pub use coopmat::{CoopTiles, coop_source};

/// Output tile rows (activations) and columns (weight rows) of both variants.
pub const TILE: u32 = 64;

/// A GEMM kernel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantGemm {
    /// Weight format the kernel decodes.
    pub kind: WeightKind,
    /// Cooperative-matrix tiles (needs the adapter's f16 16x16x16 -> f32 shape and subgroups of 32).
    pub coopmat: bool,
    /// Compile without naga's bounds checks: honoured only by [`GemmPlan`], once it has validated
    /// every binding; the config's own `source` is always checked.
    pub unchecked: bool,
    /// The activations are f16 (`[m][K]`, written by [`super::HalfRowsPlan`] or a producer of
    /// its own), read as they are; else f32. The coopmat variant rounds f32 activations to f16
    /// as it stages them, so f16 input rounded the same way gives the same result while it
    /// reads half the bytes (every column block re-reads its rows); the tiled variant widens
    /// f16 input to f32. Needs `env.f16`.
    pub x_f16: bool,
}

impl QuantGemm {
    /// The fastest variant the adapter supports.
    pub fn new(kind: WeightKind, ctx: &GpuContext) -> QuantGemm {
        QuantGemm { kind, coopmat: Self::coopmat_available(ctx), unchecked: false, x_f16: false }
    }

    /// Whether the cooperative-matrix variant can run here.
    pub fn coopmat_available(ctx: &GpuContext) -> bool {
        let c = ctx.capabilities();
        c.has_coopmat_f16_16x16x16() && c.shader_f16 && c.subgroups && c.subgroup_min_size == 32 && c.subgroup_max_size == 32
    }

    /// Every variant the tests validate with naga (f16 input only where `env` has f16, coopmat
    /// only where it also has subgroups).
    pub fn all_for(env: &KernelEnv) -> Vec<QuantGemm> {
        let mut v = Vec::new();
        for kind in WeightKind::all() {
            for x_f16 in [false, true] {
                if x_f16 && !env.f16 {
                    continue;
                }
                v.push(QuantGemm { kind, coopmat: false, unchecked: false, x_f16 });
                if env.f16 && env.subgroups {
                    v.push(QuantGemm { kind, coopmat: true, unchecked: false, x_f16 });
                }
            }
        }
        v
    }

    /// The WGSL source for `env` (compiled with bounds checks; see [`GemmPlan`] for
    /// `unchecked`). The coopmat variant uses [`CoopTiles::DEFAULT`] and needs `env.f16` and
    /// `env.subgroups`, f16 input `env.f16` ([`QuantError::Config`] otherwise).
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        let name =
            format!("quant_gemm_{}{}{}", self.kind.name().to_lowercase(), if self.coopmat { "_coop" } else { "_tiled" }, if self.x_f16 { "_xh" } else { "" });
        let mut pre = decoder(self.kind);
        if self.coopmat {
            return coop_source(self.kind, &CoopTiles::DEFAULT, self.x_f16, env);
        }
        if self.x_f16 && !env.f16 {
            return Err(QuantError::Config { what: "GEMM with f16 activations", reason: "needs f16".into() });
        }
        let kb = {
            pre.push_str("var<workgroup> As: array<f32, 2048>;\nvar<workgroup> Ws: array<f32, 2048>;\n");
            let body = "    let n0 = wid.x * 64u;
    let m0 = wid.y * 64u;
    let tx = lidx & 15u;
    let ty = lidx >> 4u;
    var acc: array<vec4<f32>, 4>;
    // Split `wid.z` over K: chunks `kc_lo .. kc_hi` (`ks_per` each; 0: every chunk), stored
    // `split_off` elements further on per split.
    let kc_lo = min(wid.z * p.ks_per, p.cpr);
    let kc_hi = select(p.cpr, min(kc_lo + p.ks_per, p.cpr), p.ks_per > 0u);
    let yo = wid.z * p.split_off;
    for (var kc = kc_lo; kc < kc_hi; kc++) {
        for (var t = 0u; t < 2u; t++) {
            let idx = lidx + t * 256u;
            let r = idx >> 3u;
            let e = idx & 7u;
            let gm = m0 + r;
            var xv = vec4<f32>(0.0);
            if (gm < p.m) { xv = vec4<f32>(x[gm * p.k4 + kc * 8u + e]); }
            let o = e * 4u * 64u + r;
            As[o] = xv.x; As[o + 64u] = xv.y; As[o + 128u] = xv.z; As[o + 192u] = xv.w;
        }
        if (lidx < 64u) {
            let row = min(n0 + lidx, p.rows - 1u);
            let v = dqf(row * p.cpr + kc);
            for (var i = 0u; i < 8u; i++) {
                let o = i * 4u * 64u + lidx;
                Ws[o] = v[i].x; Ws[o + 64u] = v[i].y; Ws[o + 128u] = v[i].z; Ws[o + 192u] = v[i].w;
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            let ao = kk * 64u + ty * 4u;
            let bo = kk * 64u + tx * 4u;
            let a4 = vec4<f32>(As[ao], As[ao + 1u], As[ao + 2u], As[ao + 3u]);
            let b4 = vec4<f32>(Ws[bo], Ws[bo + 1u], Ws[bo + 2u], Ws[bo + 3u]);
            acc[0] = fma(vec4<f32>(a4.x), b4, acc[0]);
            acc[1] = fma(vec4<f32>(a4.y), b4, acc[1]);
            acc[2] = fma(vec4<f32>(a4.z), b4, acc[2]);
            acc[3] = fma(vec4<f32>(a4.w), b4, acc[3]);
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let gm = m0 + ty * 4u + i;
        if (gm >= p.m) { continue; }
        let a = acc[i];
        for (var j = 0u; j < 4u; j++) {
            let gn = n0 + tx * 4u + j;
            if (gn < p.rows) { y[yo + gm * p.n_out + p.row0 + gn] = select(select(select(a.w, a.z, j == 2u), a.y, j == 1u), a.x, j == 0u); }
        }
    }
";
            let kb = KernelBuilder::new(name, *env).workgroup(256, 1, 1).prelude(&pre).body(body);
            if self.x_f16 { kb.enable_f16() } else { kb }
        };
        Ok(kb
            .storage("x", Access::Read, if self.x_f16 { "array<vec4<f16>>" } else { "array<vec4<f32>>" })
            .storage("wv", Access::Read, "array<vec4<u32>>")
            .storage("ws", Access::Read, "array<u32>")
            .storage("y", Access::ReadWrite, "array<f32>")
            .params(&PARAMS.iter().copied().chain(["ks_per", "split_off"]).collect::<Vec<_>>())
            .build())
    }
}

/// One part and 1..=8 splits, else [`QuantError::Config`].
fn check_splits(w: &QuantMatrix, splits: u32) -> Result<()> {
    if w.parts.len() != 1 || !(1..=8).contains(&splits) {
        return Err(QuantError::Config { what: "split-K GEMM", reason: format!("{} parts, {splits} splits (one part, 1..=8 splits)", w.parts.len()) });
    }
    Ok(())
}

/// 32-element chunks of K per split of a GEMM split `splits` ways over rows of `cpr` chunks,
/// with K steps of `cpk` chunks: the even share rounded up to a whole number of 128-element
/// steps (the row bands' largest) and of the block's own steps, so that every band's splits
/// start at the same K (the later splits may be empty, and store zeros).
pub(crate) fn split_chunks(cpr: usize, splits: u32, cpk: usize) -> usize {
    const BAND_STEP_CHUNKS: usize = 4;
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let unit = BAND_STEP_CHUNKS / gcd(BAND_STEP_CHUNKS, cpk) * cpk;
    cpr.div_ceil(splits.max(1) as usize).next_multiple_of(unit)
}

/// One row band of a [`GemmPlan`]: its block shape, the step rows it runs (`lo < m <= hi`) and
/// what every band shares.
struct Band {
    tiles: CoopTiles,
    lo: u32,
    hi: u32,
    /// The plan's most rows.
    max: u32,
    splits: u32,
    split_off: usize,
    skip_decode_only: bool,
    cols: (usize, usize),
}

/// One GEMM over every part of a matrix (one dispatch per part and row band: the coopmat
/// variant's block shape follows the step's rows, [`CoopTiles::ROW_BANDS`]), built once for at
/// most `max_m` activation rows: a recording for `step` computes rows `0..step.n_tok` (the
/// kernel's `m` and the grid's row-block count follow the step; a step of more than `max_m`
/// tokens is [`QuantError::StepTooLarge`], one of none records nothing).
#[derive(Clone, Debug)]
pub struct GemmPlan {
    plan: Plan,
    max_m: usize,
}

impl GemmPlan {
    /// `y` (`max_m x N` f32) from `x` (`max_m x K` f32), the fastest block shape for each step's
    /// row count ([`CoopTiles::ROW_BANDS`]: one dispatch per band, each run only by steps of its
    /// rows).
    pub fn new(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, x: &Binding, y: &Binding, max_m: usize) -> Result<GemmPlan> {
        Self::build(ctx, cfg, None, &CoopTiles::ROW_BANDS, w, x, &GemvOutput::Single(y.clone()), max_m, 1, false)
    }

    /// As [`GemmPlan::new`] with an explicit coopmat block shape (ignored by the tiled variant).
    /// Validates `w`, the tiles and both bindings (a short one is
    /// [`QuantError::BufferTooSmall`] naming it).
    pub fn with_tiles(ctx: &GpuContext, cfg: &QuantGemm, tiles: CoopTiles, w: &QuantMatrix, x: &Binding, y: &Binding, max_m: usize) -> Result<GemmPlan> {
        Self::build(ctx, cfg, Some(tiles), &[], w, x, &GemvOutput::Single(y.clone()), max_m, 1, false)
    }

    /// As [`GemmPlan::new`] with the output placed as `output` says: [`GemvOutput::Single`], or
    /// [`GemvOutput::Columns`] (columns `offset .. offset + N` of a row-major `max_m x stride`
    /// output: a projection into its part of an engine's packed rows).
    pub fn with_output(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, x: &Binding, output: &GemvOutput, max_m: usize) -> Result<GemmPlan> {
        Self::build(ctx, cfg, None, &CoopTiles::ROW_BANDS, w, x, output, max_m, 1, false)
    }

    /// As [`GemmPlan::with_output`], in batched steps whose decode rows
    /// ([`StepValues::decode_rows`]) a [`super::GemvPlan::decode_rows`] recorded after it
    /// computes: a step of decode rows only skips the GEMM; otherwise it runs over every row
    /// (the GEMV then overwrites the decode rows).
    pub fn beside_decode_rows(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, x: &Binding, output: &GemvOutput, max_m: usize) -> Result<GemmPlan> {
        Self::build(ctx, cfg, None, &CoopTiles::ROW_BANDS, w, x, output, max_m, 1, true)
    }

    /// The GEMM split over K into `splits` partial sums, for a grid of too few blocks to fill
    /// the GPU evenly (the split multiplies the blocks): partial `z` goes to `y` at element `z *
    /// max_m * N` (`y` holds `splits * max_m * N` f32), and the consumer adds them up (such as
    /// [`crate::rope::QkvRopePlan::with_partial_sum`]). Needs one part and 1..=8 splits (typed
    /// errors otherwise); the coopmat variant runs the default block shape.
    pub fn with_split_k(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, x: &Binding, y: &Binding, max_m: usize, splits: u32) -> Result<GemmPlan> {
        Self::with_tiles_split_k(ctx, cfg, CoopTiles::DEFAULT, w, x, y, max_m, splits)
    }

    /// [`GemmPlan::with_split_k`] with an explicit coopmat block shape (ignored by the tiled
    /// variant): for the narrow blocks of few rows ([`CoopTiles::ROW_BANDS`]), whose grids over
    /// a 4096-wide projection are 128 workgroups of two subgroups each.
    #[allow(clippy::too_many_arguments)]
    pub fn with_tiles_split_k(
        ctx: &GpuContext,
        cfg: &QuantGemm,
        tiles: CoopTiles,
        w: &QuantMatrix,
        x: &Binding,
        y: &Binding,
        max_m: usize,
        splits: u32,
    ) -> Result<GemmPlan> {
        check_splits(w, splits)?;
        Self::build(ctx, cfg, Some(tiles), &[], w, x, &GemvOutput::Single(y.clone()), max_m, splits, false)
    }

    /// The GEMM for a batched engine's steps, split over K into `splits` partial sums in
    /// `partials` (`splits * max_m * N` f32), then added up into `output` ([`SplitSumPlan`],
    /// one more dispatch; not [`GemvOutput::Qkv`]). The coopmat variant's block shape follows
    /// the step's rows as [`GemmPlan::with_output`]'s does, from [`CoopTiles::SPLIT_ROW_BANDS`].
    /// Every band splits K at the same elements (the even share rounded up to whole 128-element
    /// steps) and the sum runs in one order, so a row's result is the same bits whatever rows
    /// share its step: what an engine needs where a sequence must give what it gives alone.
    /// Pays where a band's grid is a few hundred workgroups or fewer
    /// ([`GemmPlan::row_band_splits`]). `splits` = 1 runs no split and no sum (`partials`
    /// unused). Needs one part and 1..=8 splits (typed errors otherwise).
    #[allow(clippy::too_many_arguments)]
    pub fn with_split_k_sum(
        ctx: &GpuContext,
        cfg: &QuantGemm,
        w: &QuantMatrix,
        x: &Binding,
        partials: &Binding,
        output: &GemvOutput,
        max_m: usize,
        splits: u32,
    ) -> Result<GemmPlan> {
        check_splits(w, splits)?;
        if splits == 1 {
            return Self::build(ctx, cfg, None, &CoopTiles::SPLIT_ROW_BANDS, w, x, output, max_m, 1, false);
        }
        let sum = SplitSumPlan::new(ctx, partials, output, max_m, w.rows, splits)?;
        let mut gemm = Self::with_split_k_partials(ctx, cfg, w, x, partials, max_m, splits)?;
        gemm.plan.append(sum.plan());
        Ok(gemm)
    }

    /// [`GemmPlan::with_split_k_sum`] without its sum, for a consumer that adds the partials
    /// itself in the same order ([`crate::norm::NormPlan::with_partials`]: the residual add and
    /// RMSNorm after an output projection): the row bands of [`CoopTiles::SPLIT_ROW_BANDS`], K
    /// split at the same elements in every band, partial `z` at element `z * max_m * N` of
    /// `partials`. Needs one part and 2..=8 splits (typed errors otherwise).
    #[allow(clippy::too_many_arguments)]
    pub fn with_split_k_partials(
        ctx: &GpuContext,
        cfg: &QuantGemm,
        w: &QuantMatrix,
        x: &Binding,
        partials: &Binding,
        max_m: usize,
        splits: u32,
    ) -> Result<GemmPlan> {
        check_splits(w, splits)?;
        if splits < 2 {
            return Err(QuantError::Config { what: "split GEMM", reason: format!("{splits} split: partial sums need 2 to 8") });
        }
        Self::build(ctx, cfg, None, &CoopTiles::SPLIT_ROW_BANDS, w, x, &GemvOutput::Single(partials.clone()), max_m, splits, false)
    }

    /// K splits worth taking for the row bands' GEMMs over a matrix of `rows x cols`
    /// ([`GemmPlan::with_split_k_sum`]): doubled from 1 while the 32-row band's grid
    /// (`rows / 32` blocks) is under 512 workgroups, up to 4 splits of at least 1024 inputs
    /// each. On the H100 (2026-12-07, `cargo xtask bench --kernels --only rows`, Q4_0), 4
    /// splits take Llama-3-8B's O projection (4096 x 4096) from 50 to 32 us at 32 rows and from
    /// 72 to 31 us at 64, its down projection (4096 x 14336) from 154 to 88 and from 228 to 78,
    /// and Q/K/V (6144 x 4096) from 50 to 43 and from 72 to 48; gate/up (28672 x 4096, 896
    /// blocks) gains under 10% and takes none.
    pub fn row_band_splits(rows: usize, cols: usize) -> u32 {
        let blocks = rows.div_ceil(32);
        let mut s = 1;
        while blocks * s < 512 && s < 4 && cols / (2 * s) >= 1024 {
            s *= 2;
        }
        s as u32
    }

    /// Blocks of the default coopmat shape a GEMM of `m` rows over `w` dispatches (without a K
    /// split): what decides whether [`GemmPlan::with_split_k`] pays.
    pub fn coop_blocks(w: &QuantMatrix, m: usize) -> usize {
        let t = CoopTiles::DEFAULT;
        m.div_ceil(t.bm as usize) * w.parts.iter().map(|p| p.rows.div_ceil(t.bn as usize)).sum::<usize>()
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        ctx: &GpuContext,
        cfg: &QuantGemm,
        tiles: Option<CoopTiles>,
        table: &[(u32, CoopTiles)],
        w: &QuantMatrix,
        x: &Binding,
        output: &GemvOutput,
        max_m: usize,
        splits: u32,
        skip_decode_only: bool,
    ) -> Result<GemmPlan> {
        const OP: &str = "gemm";
        if cfg.kind != w.kind() {
            return Err(QuantError::Shape { what: OP, reason: format!("kernel for {} given {}", cfg.kind.name(), w.kind().name()) });
        }
        w.validate()?;
        if cfg.coopmat && !QuantGemm::coopmat_available(ctx) {
            return Err(QuantError::Unsupported {
                name: w.name.clone(),
                reason: "the adapter has no f16 16x16x16 cooperative matrix with subgroups of 32".into(),
            });
        }
        if max_m == 0 {
            return Err(QuantError::Shape { what: OP, reason: "a GEMM plan for 0 activation rows".into() });
        }
        if cfg.x_f16 && !ctx.capabilities().shader_f16 {
            return Err(QuantError::Unsupported { name: w.name.clone(), reason: "f16 activations need the adapter's shader-f16 feature".into() });
        }
        check_binding(OP, "x", x, mul("x elements", max_m, w.cols)?, if cfg.x_f16 { 2 } else { 4 })?;
        let (ys, _) = output.checked(OP, false, max_m, w.rows)?;
        let y = &ys[0];
        // The partial sums of a K split, `max_m * N` apart (0: no split).
        let split_off = if splits > 1 { mul("GEMM output elements", max_m, w.rows)? } else { 0 };
        if splits > 1 {
            check_binding(OP, "y", y, mul("split outputs", split_off, splits as usize)?, 4)?;
        }
        let cols = out_cols(output, w.rows);
        let caps = ctx.capabilities();
        let env = env_of(caps);
        let max = to_u32("GEMM rows", max_m)?;
        let max_shared = caps.limits.max_compute_workgroup_storage_size;
        // (tiles, rows above which and up to which a step runs them): one band unless the
        // coopmat variant picks its shape by the step's rows.
        let bands: Vec<(CoopTiles, u32, u32)> = match tiles {
            Some(t) => vec![(t, 0, u32::MAX)],
            None if cfg.coopmat => CoopTiles::bands_of(table, max, max_shared),
            None => vec![(CoopTiles::DEFAULT, 0, u32::MAX)],
        };
        let mut plan = Plan::new();
        for (t, lo, hi) in bands {
            if cfg.coopmat && !t.valid(max_shared) {
                return Err(QuantError::Config {
                    what: "coopmat tiles",
                    reason: format!("{t} are not well formed or need more workgroup memory than the adapter's"),
                });
            }
            let band = Band { tiles: t, lo, hi, max, splits, split_off, skip_decode_only, cols };
            plan.append(&Self::band_plan(ctx, cfg, &env, w, x, y, &band)?);
        }
        Ok(GemmPlan { plan, max_m })
    }

    /// The dispatches of one row band (`band.lo < m <= band.hi` rows), one per part of `w`.
    fn band_plan(ctx: &GpuContext, cfg: &QuantGemm, env: &KernelEnv, w: &QuantMatrix, x: &Binding, y: &Binding, band: &Band) -> Result<Plan> {
        let &Band { tiles, lo, hi, max, splits, split_off, skip_decode_only, cols } = band;
        let (src, bm, bn) = if cfg.coopmat { (coop_source(cfg.kind, &tiles, cfg.x_f16, env)?, tiles.bm, tiles.bn) } else { (cfg.source(env)?, TILE, TILE) };
        let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let most = max.min(hi);
        if most.div_ceil(bm) > limit {
            return Err(QuantError::Gpu(numr::NumrError::GridTooLarge { workgroups: most.div_ceil(bm) as u64, limit }));
        }
        let gxs = w.parts.iter().map(|part| to_u32("GEMM column blocks", part.rows.div_ceil(bn as usize))).collect::<Result<Vec<u32>>>()?;
        if let Some(&gx) = gxs.iter().find(|&&gx| gx > limit) {
            return Err(QuantError::Gpu(numr::NumrError::GridTooLarge { workgroups: gx as u64, limit }));
        }
        let kernel = PartKernel { src, unchecked: cfg.unchecked, before: vec![x.clone()], after: vec![y.clone()], cols };
        // SAFETY: the GEMM's indices are bounded as follows, by what `build` validated.
        // - Activations `x[gm * k4 + kv]` (vec4): the kernel's `m` is the step's row count,
        //   clamped to `max_m` in the plan itself, and every row is `< m` (tested, or clamped
        //   to `m - 1`; the grid is empty for a step of 0 rows, so `m >= 1` when it runs);
        //   `kv < k4 = K / 4` (tested, or `kc * 8 + e`, `kc < cpr`); `x` holds `max_m * K` f32.
        // - Weight chunks `min(n0 + i, rows - 1) * cpr + min(kc, cpr - 1)` are below the
        //   part's `rows * cpr` chunks; `w.validate()` checked its sections and buffer.
        // - Stores `y[gm * n_out + row0 + gn]` under `gm < m`, `gn < rows` (so `row0 + gn <
        //   N`, or with `GemvOutput::Columns` `< offset + N <= stride = n_out`, `y` holding
        //   `max_m * stride`, checked); the coopmat direct stores only when the whole `bm x bn` block is inside
        //   (`m0 + bm <= m`, `n0 + bn <= rows`); `y` holds `max_m * N` f32. A K split adds
        //   `z * max_m * N` with `z < splits` (the grid's z), and `y` then holds `splits *
        //   max_m * N` f32 (checked above; `GemvOutput::Single`, so `n_out = N`).
        // - Workgroup tiles by construction of the (validated) tile shape; the coopmat
        //   kernel's per-subgroup scratch by `sg_idx < sg_count = sg_m * sg_n` (subgroups of
        //   exactly 32, which `coopmat_available` checked). Every product fits 32 bits.
        unsafe {
            kernel.plan(
                ctx,
                w,
                |i, _| Ok([gxs[i], 0, 1]),
                |i, _, d| {
                    let gx = gxs[i];
                    let d = d.per_step("m", move |s| step_rows(s, max))?.grid_per_step(move |s| {
                        let m = step_rows(s, max);
                        if (skip_decode_only && s.decode_rows >= s.n_tok) || m <= lo || m > hi { [0, 0, 0] } else { [gx, m.div_ceil(bm), splits] }
                    });
                    // The tiled variant's K steps are one chunk.
                    let cpk = if cfg.coopmat { tiles.bk as usize / 32 } else { 1 };
                    let ks_per = if splits > 1 { split_chunks(w.chunks_per_row(), splits, cpk) / cpk } else { 0 };
                    Ok(d.set_usize("ks_per", ks_per)?.set_usize("split_off", split_off)?)
                },
            )
        }
    }

    /// The most activation rows a step may have.
    pub fn max_m(&self) -> usize {
        self.max_m
    }

    /// The dispatches, for an engine to append to its own plan (its row count is `step.n_tok`,
    /// clamped to [`GemmPlan::max_m`]).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Records the GEMM of `step.n_tok` rows.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        check_step("gemm", step, self.max_m)?;
        Ok(self.plan.record(rec, step)?)
    }

    /// Records into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &GpuContext, step: &StepValues) -> Result<()> {
        check_step("gemm", step, self.max_m)?;
        Ok(self.plan.run(ctx, step)?)
    }
}
