//! Batched, tiled matmul `C[b] = A[b] · B[b]` for f32 and f16 inputs with f32 accumulation.
//! A and B are read through strides (so transposed and broadcast views need no copy). Each
//! 16×16 workgroup computes a 64×64 tile of C, 4×4 per invocation, staging 64×16 of A and 16×64 of
//! B through workgroup memory per step of K. Grid: (N/64, M/64, batch).
//!
//! Output is f32, or f16 (stored directly) when the input is f16 and the adapter has SHADER_F16.

use crate::dtype::DType;
use crate::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::snippets::load_fn;

pub const TILE: u32 = 64;
pub const BK: u32 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// Input dtype: F32 or F16.
    pub dtype: DType,
    /// Write f16 output directly (needs `env.f16`); else f32.
    pub out_f16: bool,
    /// Read f16 inputs as `array<f16>` elements (needs `env.f16`) instead of unpacking u32 words.
    pub native_f16_loads: bool,
}

impl Matmul {
    pub fn all(env: &KernelEnv) -> Vec<Matmul> {
        let mut v = vec![
            Matmul { dtype: DType::F32, out_f16: false, native_f16_loads: false },
            Matmul { dtype: DType::F16, out_f16: false, native_f16_loads: false },
        ];
        if env.f16 {
            v.push(Matmul { dtype: DType::F16, out_f16: true, native_f16_loads: false });
            v.push(Matmul { dtype: DType::F16, out_f16: true, native_f16_loads: true });
        }
        v
    }

    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let name = format!(
            "matmul_{}{}{}",
            self.dtype,
            if self.out_f16 { "_f16out" } else { "" },
            if self.native_f16_loads { "_f16loads" } else { "" }
        );
        let native_f16 = self.dtype == DType::F16 && env.f16 && self.native_f16_loads;
        let mut pre = String::new();
        let (in_ty, ld_a, ld_b) = if native_f16 {
            ("array<f16>", "f32(a[i])", "f32(b[i])")
        } else {
            pre.push_str(&load_fn("a", self.dtype));
            pre.push_str(&load_fn("b", self.dtype));
            ("array<u32>", "ld_a(i)", "ld_b(i)")
        };
        pre.push_str(&format!("fn la(i: u32) -> f32 {{ return {ld_a}; }}\nfn lb(i: u32) -> f32 {{ return {ld_b}; }}\n"));
        pre.push_str("var<workgroup> As: array<f32, 1024>;\nvar<workgroup> Bs: array<f32, 1024>;\n");
        let store = if self.out_f16 { "f16(acc[r][c])" } else { "acc[r][c]" };
        let body = format!(
            "    let batch = wid.z;
    let m0 = wid.y * 64u;
    let n0 = wid.x * 64u;
    let abase = p.a_off + batch * p.a_sb;
    let bbase = p.b_off + batch * p.b_sb;
    var acc: array<vec4<f32>, 4>;
    for (var k0 = 0u; k0 < p.k; k0 += 16u) {{
        for (var t = 0u; t < 4u; t++) {{
            let idx = lidx + t * 256u;
            let r = idx / 16u;
            let kk = idx % 16u;
            let gm = m0 + r;
            let gk = k0 + kk;
            var v = 0.0;
            if (gm < p.m && gk < p.k) {{ v = la(abase + gm * p.a_sm + gk * p.a_sk); }}
            As[kk * 64u + r] = v;
            let kb = idx / 64u;
            let c = idx % 64u;
            let gn = n0 + c;
            let gkb = k0 + kb;
            var w = 0.0;
            if (gn < p.n && gkb < p.k) {{ w = lb(bbase + gkb * p.b_sk + gn * p.b_sn); }}
            Bs[kb * 64u + c] = w;
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {{
            let ao = kk * 64u + lid.y * 4u;
            let bo = kk * 64u + lid.x * 4u;
            let a4 = vec4<f32>(As[ao], As[ao + 1u], As[ao + 2u], As[ao + 3u]);
            let b4 = vec4<f32>(Bs[bo], Bs[bo + 1u], Bs[bo + 2u], Bs[bo + 3u]);
            acc[0] = fma(vec4<f32>(a4.x), b4, acc[0]);
            acc[1] = fma(vec4<f32>(a4.y), b4, acc[1]);
            acc[2] = fma(vec4<f32>(a4.z), b4, acc[2]);
            acc[3] = fma(vec4<f32>(a4.w), b4, acc[3]);
        }}
        workgroupBarrier();
    }}
    let cbase = batch * p.m * p.n;
    for (var r = 0u; r < 4u; r++) {{
        let gm = m0 + lid.y * 4u + r;
        if (gm >= p.m) {{ continue; }}
        for (var c = 0u; c < 4u; c++) {{
            let gn = n0 + lid.x * 4u + c;
            if (gn < p.n) {{ out[cbase + gm * p.n + gn] = {store}; }}
        }}
    }}
"
        );
        let mut b = KernelBuilder::new(name, *env);
        if native_f16 || self.out_f16 {
            b = b.enable_f16();
        }
        let out_ty = if self.out_f16 { "array<f16>" } else { "array<f32>" };
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
