//! Batched, tiled matmul `C[b] = A[b] · B[b]` for f32 and f16 inputs with f32 accumulation.
//! A and B are read through strides (so transposed and broadcast views need no copy). Each
//! 16×16 workgroup computes a 64×64 tile of C, 4×4 per invocation, staging 64×16 of A and 16×64 of
//! B through workgroup memory per step of K. Grid: (N/64, M/64, batch).
//!
//! Output is f32, or f16 (stored directly) when the input is f16 and the adapter has SHADER_F16.
//! The output store indexes the accumulators only with constants (see [`Matmul::unrolled_store`]).

use crate::dtype::DType;
use crate::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::snippets::load_fn;

/// Rows and columns of the C tile one workgroup computes.
pub const TILE: u32 = 64;
/// Depth of one K step staged through workgroup memory.
pub const BK: u32 = 16;

/// One variant of the tiled matmul kernel (see the module docs for the tiling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// Input dtype: F32 or F16.
    pub dtype: DType,
    /// Write f16 output directly (needs `env.f16`); else f32.
    pub out_f16: bool,
    /// Read f16 inputs as `array<f16>` elements (needs `env.f16`) instead of unpacking u32 words.
    pub native_f16_loads: bool,
    /// f16 only: each tile-load step reads one u32 word (two adjacent f16) and writes both halves
    /// to workgroup memory. Needs A contiguous along K and B along N (`a_sk == b_sn == 1`) and every
    /// other stride and offset even (checked by the caller). Ignores `native_f16_loads`.
    pub pair_loads: bool,
    /// f16 only (needs `env.f16`): keep the staged tiles as f16 in workgroup memory.
    pub f16_tiles: bool,
    /// Write the 4×4 accumulators with constant indices (an unrolled store) instead of a loop
    /// indexing `acc[r][c]` with runtime `r, c`. Measured on the H200 (Vulkan), 4096³: with the loop
    /// store every f16 variant ran at 2.3 TFLOP/s (the driver keeps `acc` in local memory, so every
    /// FMA goes through it; the f32 kernel escaped by luck of its heuristics), with this store
    /// 12.5-13.3 TFLOP/s. numr's matmul always uses it.
    pub unrolled_store: bool,
    /// Names the variant `_unchecked` (benchmark only). [`Matmul::source`] always emits a checked
    /// module; a caller that has validated its buffers turns the checks off itself with the
    /// `unsafe` [`crate::gpu::KernelSource::assume_in_bounds`].
    pub unchecked: bool,
}

impl Matmul {
    /// The plain variant for `dtype` (f32 output, u32-word loads, checked).
    pub const fn new(dtype: DType) -> Matmul {
        Matmul { dtype, out_f16: false, native_f16_loads: false, pair_loads: false, f16_tiles: false, unrolled_store: false, unchecked: false }
    }

    /// The variants validated for `env`: f32 and f16 inputs with the load and store options, plus
    /// the f16-output and f16-tile variants when `env.f16`.
    pub fn all(env: &KernelEnv) -> Vec<Matmul> {
        let f32 = Matmul::new(DType::F32);
        let f16 = Matmul::new(DType::F16);
        let mut v = vec![
            f32,
            Matmul { unrolled_store: true, ..f32 },
            f16,
            Matmul { unrolled_store: true, ..f16 },
            Matmul { pair_loads: true, ..f16 },
            Matmul { pair_loads: true, unrolled_store: true, ..f16 },
        ];
        if env.f16 {
            let o = Matmul { out_f16: true, ..f16 };
            v.push(o);
            v.push(Matmul { unrolled_store: true, ..o });
            v.push(Matmul { native_f16_loads: true, ..o });
            v.push(Matmul { native_f16_loads: true, unrolled_store: true, ..o });
            v.push(Matmul { pair_loads: true, unrolled_store: true, ..o });
            v.push(Matmul { f16_tiles: true, ..f16 });
            v.push(Matmul { f16_tiles: true, unrolled_store: true, pair_loads: true, ..o });
        }
        v
    }

    /// The WGSL. Bindings `a`, `b` (read) and `out` (written, contiguous `[batch][m][n]`);
    /// parameters `m`, `n`, `k`, and per input an element offset and batch/row/column strides.
    /// Options that need `env.f16` are ignored without it.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let is16 = self.dtype == DType::F16;
        let pair = is16 && self.pair_loads;
        let tiles16 = is16 && self.f16_tiles && env.f16;
        let native_f16 = is16 && env.f16 && self.native_f16_loads && !pair;
        let out_f16 = self.out_f16 && env.f16;
        let name = format!(
            "matmul_{}{}{}{}{}{}{}",
            self.dtype,
            if out_f16 { "_f16out" } else { "" },
            if native_f16 { "_f16loads" } else { "" },
            if pair { "_pair" } else { "" },
            if tiles16 { "_f16tiles" } else { "" },
            if self.unrolled_store { "_ustore" } else { "" },
            if self.unchecked { "_unchecked" } else { "" },
        );
        let mut pre = String::new();
        let (in_ty, ld_a, ld_b) = if native_f16 {
            ("array<f16>", "f32(a[i])", "f32(b[i])")
        } else {
            pre.push_str(&load_fn("a", self.dtype));
            pre.push_str(&load_fn("b", self.dtype));
            ("array<u32>", "ld_a(i)", "ld_b(i)")
        };
        pre.push_str(&format!("fn la(i: u32) -> f32 {{ return {ld_a}; }}\nfn lb(i: u32) -> f32 {{ return {ld_b}; }}\n"));
        let (tty, wr, rd) = if tiles16 { ("f16", "f16", "f32") } else { ("f32", "", "") };
        pre.push_str(&format!("var<workgroup> As: array<{tty}, 1024>;\nvar<workgroup> Bs: array<{tty}, 1024>;\n"));
        let load = if pair {
            // Word w holds elements 2w, 2w+1; the element index of the pair's first is even.
            format!(
                "        for (var t = 0u; t < 2u; t++) {{
            let idx = lidx + t * 256u;
            let r = idx / 8u;
            let kk = (idx % 8u) * 2u;
            let gm = m0 + r;
            let gk = k0 + kk;
            var v = vec2<f32>(0.0);
            if (gm < p.m && gk < p.k) {{
                v = unpack2x16float(a[(abase + gm * p.a_sm + gk) >> 1u]);
                if (gk + 1u >= p.k) {{ v.y = 0.0; }}
            }}
            As[kk * 64u + r] = {wr}(v.x);
            As[kk * 64u + 64u + r] = {wr}(v.y);
            let kb = idx / 32u;
            let c = (idx % 32u) * 2u;
            let gn = n0 + c;
            let gkb = k0 + kb;
            var w = vec2<f32>(0.0);
            if (gn < p.n && gkb < p.k) {{
                w = unpack2x16float(b[(bbase + gkb * p.b_sk + gn) >> 1u]);
                if (gn + 1u >= p.n) {{ w.y = 0.0; }}
            }}
            Bs[kb * 64u + c] = {wr}(w.x);
            Bs[kb * 64u + c + 1u] = {wr}(w.y);
        }}
"
            )
        } else {
            format!(
                "        for (var t = 0u; t < 4u; t++) {{
            let idx = lidx + t * 256u;
            let r = idx / 16u;
            let kk = idx % 16u;
            let gm = m0 + r;
            let gk = k0 + kk;
            var v = 0.0;
            if (gm < p.m && gk < p.k) {{ v = la(abase + gm * p.a_sm + gk * p.a_sk); }}
            As[kk * 64u + r] = {wr}(v);
            let kb = idx / 64u;
            let c = idx % 64u;
            let gn = n0 + c;
            let gkb = k0 + kb;
            var w = 0.0;
            if (gn < p.n && gkb < p.k) {{ w = lb(bbase + gkb * p.b_sk + gn * p.b_sn); }}
            Bs[kb * 64u + c] = {wr}(w);
        }}
"
            )
        };
        let cv = |e: &str| if self.out_f16 && env.f16 { format!("f16({e})") } else { e.to_string() };
        let store = if self.unrolled_store {
            let mut s = String::from("    let cbase = batch * p.m * p.n;\n    let gn0 = n0 + lid.x * 4u;\n");
            for r in 0..4 {
                s.push_str(&format!("    {{\n        let gm = m0 + lid.y * 4u + {r}u;\n        if (gm < p.m) {{\n            let row = cbase + gm * p.n;\n"));
                for (c, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    s.push_str(&format!("            if (gn0 + {c}u < p.n) {{ out[row + gn0 + {c}u] = {}; }}\n", cv(&format!("acc[{r}].{comp}"))));
                }
                s.push_str("        }\n    }\n");
            }
            s
        } else {
            format!(
                "    let cbase = batch * p.m * p.n;
    for (var r = 0u; r < 4u; r++) {{
        let gm = m0 + lid.y * 4u + r;
        if (gm >= p.m) {{ continue; }}
        for (var c = 0u; c < 4u; c++) {{
            let gn = n0 + lid.x * 4u + c;
            if (gn < p.n) {{ out[cbase + gm * p.n + gn] = {}; }}
        }}
    }}
",
                cv("acc[r][c]")
            )
        };
        let body = format!(
            "    let batch = wid.z;
    let m0 = wid.y * 64u;
    let n0 = wid.x * 64u;
    let abase = p.a_off + batch * p.a_sb;
    let bbase = p.b_off + batch * p.b_sb;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 += 16u) {{
{load}        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {{
            let ao = kk * 64u + lid.y * 4u;
            let bo = kk * 64u + lid.x * 4u;
            let a4 = vec4<f32>({rd}(As[ao]), {rd}(As[ao + 1u]), {rd}(As[ao + 2u]), {rd}(As[ao + 3u]));
            let b4 = vec4<f32>({rd}(Bs[bo]), {rd}(Bs[bo + 1u]), {rd}(Bs[bo + 2u]), {rd}(Bs[bo + 3u]));
            acc[0] = fma(vec4<f32>(a4.x), b4, acc[0]);
            acc[1] = fma(vec4<f32>(a4.y), b4, acc[1]);
            acc[2] = fma(vec4<f32>(a4.z), b4, acc[2]);
            acc[3] = fma(vec4<f32>(a4.w), b4, acc[3]);
        }}
        workgroupBarrier();
    }}
{store}"
        );
        let mut b = KernelBuilder::new(name, *env);
        if native_f16 || out_f16 || tiles16 {
            b = b.enable_f16();
        }
        let out_ty = if out_f16 { "array<f16>" } else { "array<f32>" };
        b.workgroup(16, 16, 1)
            .storage("a", Access::Read, in_ty)
            .storage("b", Access::Read, in_ty)
            .storage("out", Access::ReadWrite, out_ty)
            .params(&["m", "n", "k", "a_off", "a_sb", "a_sm", "a_sk", "b_off", "b_sb", "b_sk", "b_sn"])
            .prelude(&pre)
            .body(&body)
            .build()
    }
}
