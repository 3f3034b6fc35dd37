//! [`QuantGemm`]: `Y[m][n] = sum_k X[m][k] * W[n][k]` for many activation rows (prefill).
//!
//! Both variants walk K in steps of one 32-element chunk: activations of the tile are copied to
//! workgroup memory, the tile's weight rows are dequantized into workgroup memory with the
//! format's shared decoder ([`super::decode`], `dqf`), and the tile product is accumulated.
//! - Tiled (any adapter): a 64x64 output tile per 256 invocations, 4x4 outputs each, f32.
//! - Cooperative matrix (`coopmat`, f16 16x16x16 with f32 accumulate): a 64x64 output tile per
//!   128 invocations (four subgroups of 32, each a 32x32 block of 2x2 tiles); tiles staged as f16
//!   in workgroup memory, A loaded row-major with `coopLoadT`, B (= Wᵀ, stored `[n][k]`) loaded
//!   column-major with `coopLoad`, results stored row-major to workgroup memory with
//!   `coopStoreT` and copied out with bounds checks (so M and N need not be multiples of 64).
//!   Pointer indices are bound with `let` first (naga 30's SPIR-V writer panics otherwise).

use std::sync::Arc;

use numr::gpu::{Access, Binding, BoundGroup, GpuBuffer, GpuContext, Kernel, KernelBuilder, KernelEnv, KernelSource, Recorder};

use super::decode::decoder;
use super::gemv::{part_params, PARAMS};
use super::{QuantError, QuantMatrix, Result, WeightKind};

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
        let kb = KernelBuilder::new(name, *env).unchecked(self.unchecked);
        let kb = if self.coopmat {
            pre.push_str(
                "var<workgroup> As: array<f16, 2048>;
var<workgroup> Ws: array<f16, 2048>;
var<workgroup> Cs: array<f32, 4096>;
",
            );
            let body = "    let n0 = wid.x * 64u;
    let m0 = wid.y * 64u;
    let sgi = lidx / sg_size;
    let sm = (sgi >> 1u) * 32u;
    let sn = (sgi & 1u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var kc = 0u; kc < p.cpr; kc++) {
        for (var t = 0u; t < 4u; t++) {
            let idx = lidx + t * 128u;
            let r = idx >> 3u;
            let e = idx & 7u;
            let gm = m0 + r;
            var xv = vec4<f32>(0.0);
            if (gm < p.m) { xv = x[gm * p.k4 + kc * 8u + e]; }
            let o = r * 32u + e * 4u;
            As[o] = f16(xv.x); As[o + 1u] = f16(xv.y); As[o + 2u] = f16(xv.z); As[o + 3u] = f16(xv.w);
        }
        if (lidx < 64u) {
            let row = min(n0 + lidx, p.rows - 1u);
            let v = dqf(row * p.cpr + kc);
            for (var i = 0u; i < 8u; i++) {
                let o = lidx * 32u + i * 4u;
                Ws[o] = f16(v[i].x); Ws[o + 1u] = f16(v[i].y); Ws[o + 2u] = f16(v[i].z); Ws[o + 3u] = f16(v[i].w);
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk += 16u) {
            let ia0 = sm * 32u + kk;
            let ia1 = (sm + 16u) * 32u + kk;
            let ib0 = sn * 32u + kk;
            let ib1 = (sn + 16u) * 32u + kk;
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&As[ia0], 32u);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&As[ia1], 32u);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&Ws[ib0], 32u);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&Ws[ib1], 32u);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    let i00 = sm * 64u + sn;
    let i01 = sm * 64u + sn + 16u;
    let i10 = (sm + 16u) * 64u + sn;
    let i11 = (sm + 16u) * 64u + sn + 16u;
    coopStoreT(c00, &Cs[i00], 64u);
    coopStoreT(c01, &Cs[i01], 64u);
    coopStoreT(c10, &Cs[i10], 64u);
    coopStoreT(c11, &Cs[i11], 64u);
    workgroupBarrier();
    for (var t = 0u; t < 32u; t++) {
        let idx = lidx + t * 128u;
        let r = idx >> 6u;
        let cn = idx & 63u;
        let gm = m0 + r;
        let gn = n0 + cn;
        if (gm < p.m && gn < p.rows) { y[gm * p.n_out + p.row0 + gn] = Cs[idx]; }
    }
";
            kb.enable_f16().enable("wgpu_cooperative_matrix").workgroup(128, 1, 1).subgroup_builtins().prelude(&pre).body(body)
        } else {
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
            kb.workgroup(256, 1, 1).prelude(&pre).body(body)
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
        if cfg.kind != w.kind() {
            return Err(QuantError::Shape { what: "gemm", reason: format!("kernel for {} given {}", cfg.kind.name(), w.kind().name()) });
        }
        if cfg.coopmat && !QuantGemm::coopmat_available(ctx) {
            return Err(QuantError::Unsupported { name: w.name.clone(), reason: "the adapter has no f16 16x16x16 cooperative matrix with subgroups of 32".into() });
        }
        let env = KernelEnv::from_caps(ctx.capabilities());
        let kernel = ctx.kernel(&cfg.source(&env))?;
        let max = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let mut steps = Vec::new();
        for part in &w.parts {
            let group = ctx.bind(&kernel, &[Binding::whole(x), part.binding(), part.binding(), Binding::whole(y)])?;
            let mut params = part_params(w, part).to_vec();
            params[16] = m as u32;
            let grid = [part.rows.div_ceil(TILE as usize) as u32, m.div_ceil(TILE as usize) as u32, 1];
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
