//! Streaming read: the bandwidth roofline kernel. Each invocation reads vec4 words in a
//! grid-stride loop and folds them with XOR; an invocation writes only when its fold hits one
//! magic value (so the reads cannot be optimised away, and the tail costs nothing). Benchmarks report other kernels as a fraction of what this one reaches.

use crate::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

/// Invocations per workgroup.
pub const WG: u32 = 256;

/// The streaming-read kernel (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamRead;

impl StreamRead {
    /// The WGSL: binding `src` (read, `array<vec4<u32>>`) and `dst` (`array<u32>`, written almost
    /// never); parameters `n_vec4` (vec4s to read) and `stride` (the grid-stride, in vec4s).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("stream_read", *env)
            .workgroup(WG, 1, 1)
            .storage("src", Access::Read, "array<vec4<u32>>")
            .storage("dst", Access::ReadWrite, "array<u32>")
            .params(&["n_vec4", "stride"])
            .body(
                "    var acc = vec4<u32>(0u);
    for (var i = wg_linear * 256u + lidx; i < p.n_vec4; i += p.stride) { acc ^= src[i]; }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9E3779B9u) { dst[wg_linear] = lidx; }
",
            )
            .build()
    }
}
