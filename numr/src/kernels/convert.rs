//! Convert: strided gather from any view into a new contiguous tensor, with a dtype change. It is
//! `contiguous()`, `cast()` and broadcast materialisation in one kernel family.
//!
//! Layout of the parameters: `numel`, the output shape right-aligned into 6 dims (`d0..d5`), the
//! source strides in elements (`s0..s5`), and the source element offset inside its binding.
//! Each invocation writes one output word (1, 2 or 4 elements).

use crate::dtype::DType;
use crate::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::snippets::{bits_fn, convert_fn, load_fn, pack_word};

/// Maximum rank the strided kernels handle directly.
pub const MAX_RANK: usize = 6;
/// Invocations per workgroup.
pub const WG: u32 = 256;

/// How a [`Convert`] kernel addresses its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvertMode {
    /// Any strides (up to [`MAX_RANK`] dims).
    Strided,
    /// Source is contiguous from its offset.
    Contiguous,
    /// Same dtype, contiguous, source offset a multiple of 4 words: vec4 copies (16 bytes each).
    Vec4Copy,
}

/// A gather-and-cast kernel: reads a view of `src` dtype, writes a contiguous tensor of `dst`
/// dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Convert {
    /// Dtype of the source view.
    pub src: DType,
    /// Dtype of the output (equal to `src` for [`ConvertMode::Vec4Copy`]).
    pub dst: DType,
    /// How the source is addressed.
    pub mode: ConvertMode,
}

impl Convert {
    /// Every (src, dst) pair in both strided and contiguous mode, plus a vec4 copy per dtype.
    pub fn all() -> Vec<Convert> {
        let mut v = Vec::new();
        for src in DType::ALL {
            for dst in DType::ALL {
                for mode in [ConvertMode::Strided, ConvertMode::Contiguous] {
                    v.push(Convert { src, dst, mode });
                }
            }
            v.push(Convert { src, dst: src, mode: ConvertMode::Vec4Copy });
        }
        v
    }

    /// Output words (or vec4s for [`ConvertMode::Vec4Copy`]) one workgroup covers.
    pub fn items_per_workgroup(&self) -> u32 {
        WG
    }

    /// The WGSL: bindings `src` (read) and `dst` (written); parameters as in the module docs, or
    /// `n_vec4` and `off_vec4` for [`ConvertMode::Vec4Copy`].
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let name = format!("convert_{}_{}_{:?}", self.src, self.dst, self.mode).to_lowercase();
        let b = KernelBuilder::new(name, *env).workgroup(WG, 1, 1);
        if self.mode == ConvertMode::Vec4Copy {
            return b
                .storage("src", Access::Read, "array<vec4<u32>>")
                .storage("dst", Access::ReadWrite, "array<vec4<u32>>")
                .params(&["n_vec4", "off_vec4"])
                .body("    let i = wg_linear * 256u + lidx;\n    if (i >= p.n_vec4) { return; }\n    dst[i] = src[p.off_vec4 + i];\n")
                .build();
        }
        let mut pre = load_fn("src", self.src);
        pre.push_str(&convert_fn(self.src, self.dst));
        pre.push_str(&bits_fn(self.dst));
        let mut index = String::from("fn src_index(e: u32) -> u32 {\n");
        match self.mode {
            ConvertMode::Contiguous => index.push_str("    return p.off + e;\n"),
            _ => {
                index.push_str("    var rem = e;\n    var idx = p.off;\n");
                for d in (0..MAX_RANK).rev() {
                    index.push_str(&format!("    idx += (rem % p.d{d}) * p.s{d};\n    rem = rem / p.d{d};\n"));
                }
                index.push_str("    return idx;\n");
            }
        }
        index.push_str("}\n");
        pre.push_str(&index);
        let value = format!("cv_{}_{}(ld_src(src_index(e)))", self.src.name(), self.dst.name());
        let body = format!(
            "    let w = wg_linear * {WG}u + lidx;\n    if (w * {per}u >= p.numel) {{ return; }}\n    {}    dst[w] = word;\n",
            pack_word(self.dst, &value, "w", "p.numel"),
            per = self.dst.per_word()
        );
        b.storage("src", Access::Read, "array<u32>")
            .storage("dst", Access::ReadWrite, "array<u32>")
            .params(&["numel", "off", "d0", "d1", "d2", "d3", "d4", "d5", "s0", "s1", "s2", "s3", "s4", "s5"])
            .prelude(&pre)
            .body(&body)
            .build()
    }
}
