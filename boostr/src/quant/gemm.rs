//! [`QuantGemm`]: `Y[m][n] = sum_k X[m][k] * W[n][k]` for many activation rows (prefill).
//!
//! - Tiled (any adapter): K in steps of one 32-element chunk; activations and the tile's weight
//!   rows (dequantized with the format's shared decoder, [`super::decode`], `dqf`) are staged in
//!   workgroup memory as f32; a 64x64 output tile per 256 invocations, 4x4 outputs each.
//! - Cooperative matrix (`coopmat`, f16 16x16x16 with f32 accumulate): [`coopmat`] (file
//!   `gemm_coopmat.rs`), a typed block shape [`CoopTiles`] (default 128x128 per workgroup, K steps
//!   of 64, 8 subgroups each holding 4x2 accumulators for the whole K loop, f16 staging, the
//!   next K step prefetched into registers).

use std::sync::Arc;

use numr::gpu::{Access, Binding, BoundGroup, GpuBuffer, GpuContext, Kernel, KernelBuilder, KernelEnv, KernelSource, Recorder};

use super::decode::decoder;
#[path = "gemm_coopmat.rs"]
pub mod coopmat;
use super::gemv::{PARAMS, part_params};
use super::{QuantError, QuantMatrix, Result, WeightKind};
pub use coopmat::{CoopTiles, coop_source};

/// Output tile rows (activations) and columns (weight rows) of both variants.
pub const TILE: u32 = 64;

/// A GEMM kernel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantGemm {
    pub kind: WeightKind,
    /// Cooperative-matrix tiles (needs the adapter's f16 16x16x16 -> f32 shape and subgroups of 32).
    pub coopmat: bool,
    pub unchecked: bool,
}

impl QuantGemm {
    /// The fastest variant the adapter supports.
    pub fn new(kind: WeightKind, ctx: &GpuContext) -> QuantGemm {
        QuantGemm { kind, coopmat: Self::coopmat_available(ctx), unchecked: false }
    }

    /// Whether the cooperative-matrix variant can run here.
    pub fn coopmat_available(ctx: &GpuContext) -> bool {
        let c = ctx.capabilities();
        c.has_coopmat_f16_16x16x16() && c.shader_f16 && c.subgroups && c.subgroup_min_size == 32 && c.subgroup_max_size == 32
    }

    /// Every variant the tests validate with naga (coopmat ones only where `env` has f16 and
    /// subgroups).
    pub fn all_for(env: &KernelEnv) -> Vec<QuantGemm> {
        let mut v = Vec::new();
        for kind in WeightKind::all() {
            v.push(QuantGemm { kind, coopmat: false, unchecked: false });
            if env.f16 && env.subgroups {
                v.push(QuantGemm { kind, coopmat: true, unchecked: true });
            }
        }
        v
    }

    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let name = format!(
            "quant_gemm_{}{}{}",
            self.kind.name().to_lowercase(),
            if self.coopmat { "_coop" } else { "_tiled" },
            if self.unchecked { "_unchecked" } else { "" }
        );
        let mut pre = decoder(self.kind);
        if self.coopmat {
            return coop_source(self.kind, &CoopTiles::DEFAULT, self.unchecked, env);
        }
        let kb = {
            pre.push_str("var<workgroup> As: array<f32, 2048>;\nvar<workgroup> Ws: array<f32, 2048>;\n");
            let body = "    let n0 = wid.x * 64u;
    let m0 = wid.y * 64u;
    let tx = lidx & 15u;
    let ty = lidx >> 4u;
    var acc: array<vec4<f32>, 4>;
    for (var kc = 0u; kc < p.cpr; kc++) {
        for (var t = 0u; t < 2u; t++) {
            let idx = lidx + t * 256u;
            let r = idx >> 3u;
            let e = idx & 7u;
            let gm = m0 + r;
            var xv = vec4<f32>(0.0);
            if (gm < p.m) { xv = x[gm * p.k4 + kc * 8u + e]; }
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
            if (gn < p.rows) { y[gm * p.n_out + p.row0 + gn] = select(select(select(a.w, a.z, j == 2u), a.y, j == 1u), a.x, j == 0u); }
        }
    }
";
            KernelBuilder::new(name, *env).workgroup(256, 1, 1).prelude(&pre).body(body)
        };
        kb.storage("x", Access::Read, "array<vec4<f32>>")
            .storage("wv", Access::Read, "array<vec4<u32>>")
            .storage("ws", Access::Read, "array<u32>")
            .storage("y", Access::ReadWrite, "array<f32>")
            .params(PARAMS)
            .build()
    }
}

/// Dispatches of one GEMM over every part of a matrix, built once.
pub struct GemmPlan {
    kernel: Arc<Kernel>,
    steps: Vec<(BoundGroup, Vec<u32>, [u32; 3])>,
}

impl GemmPlan {
    /// `y` (`m x N` f32) from `x` (`m x K` f32).
    pub fn new(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, x: &Arc<GpuBuffer>, y: &Arc<GpuBuffer>, m: usize) -> Result<GemmPlan> {
        Self::with_tiles(ctx, cfg, CoopTiles::DEFAULT, w, x, y, m)
    }

    /// As [`GemmPlan::new`] with an explicit coopmat block shape (ignored by the tiled variant).
    pub fn with_tiles(
        ctx: &GpuContext,
        cfg: &QuantGemm,
        tiles: CoopTiles,
        w: &QuantMatrix,
        x: &Arc<GpuBuffer>,
        y: &Arc<GpuBuffer>,
        m: usize,
    ) -> Result<GemmPlan> {
        if cfg.kind != w.kind() {
            return Err(QuantError::Shape { what: "gemm", reason: format!("kernel for {} given {}", cfg.kind.name(), w.kind().name()) });
        }
        if cfg.coopmat && !QuantGemm::coopmat_available(ctx) {
            return Err(QuantError::Unsupported {
                name: w.name.clone(),
                reason: "the adapter has no f16 16x16x16 cooperative matrix with subgroups of 32".into(),
            });
        }
        let env = KernelEnv::from_caps(ctx.capabilities());
        let (kernel, bm, bn) = if cfg.coopmat {
            if !tiles.valid(ctx.capabilities().limits.max_compute_workgroup_storage_size) {
                return Err(QuantError::Shape { what: "gemm", reason: format!("coopmat tiles {tiles:?} invalid here") });
            }
            (ctx.kernel(&coop_source(cfg.kind, &tiles, cfg.unchecked, &env))?, tiles.bm as usize, tiles.bn as usize)
        } else {
            (ctx.kernel(&cfg.source(&env))?, TILE as usize, TILE as usize)
        };
        let max = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let mut steps = Vec::new();
        for part in &w.parts {
            let group = ctx.bind(&kernel, &[Binding::whole(x), part.binding(), part.binding(), Binding::whole(y)])?;
            let mut params = part_params(w, part).to_vec();
            params[16] = m as u32;
            let grid = [part.rows.div_ceil(bn) as u32, m.div_ceil(bm) as u32, 1];
            if grid[0] > max || grid[1] > max {
                return Err(QuantError::Shape { what: "gemm", reason: format!("grid {grid:?} over {max}") });
            }
            steps.push((group, params, grid));
        }
        Ok(GemmPlan { kernel, steps })
    }

    pub fn record(&self, rec: &mut Recorder) -> Result<()> {
        for (g, p, grid) in &self.steps {
            rec.dispatch(&self.kernel, g, p, *grid)?;
        }
        Ok(())
    }
}
