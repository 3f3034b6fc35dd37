//! Streaming read: the bandwidth roofline kernel. Each invocation reads vec4 words in a
//! grid-stride loop and folds them with XOR; one word per workgroup is written so the reads cannot
//! be optimised away. Benchmarks report other kernels as a fraction of what this one reaches.

use crate::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

pub const WG: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamRead;

impl StreamRead {
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("stream_read", *env)
            .workgroup(WG, 1, 1)
            .storage("src", Access::Read, "array<vec4<u32>>")
            .storage("dst", Access::ReadWrite, "array<u32>")
            .params(&["n_vec4", "stride"])
            .prelude("var<workgroup> acc_wg: array<u32, 256>;")
            .body(
                "    var acc = vec4<u32>(0u);
    for (var i = wg_linear * 256u + lidx; i < p.n_vec4; i += p.stride) { acc ^= src[i]; }
    acc_wg[lidx] = acc.x ^ acc.y ^ acc.z ^ acc.w;
    workgroupBarrier();
    if (lidx == 0u) {
        var t = 0u;
        for (var j = 0u; j < 256u; j++) { t ^= acc_wg[j]; }
        dst[wg_linear] = t;
    }
",
            )
            .build()
    }
}
