//! Elementwise binary ops (add, mul) with broadcasting through strides, and `scale` (x * s) as the
//! unary form. Output is contiguous and of the input dtype; each invocation writes one word.

use crate::dtype::DType;
use crate::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::convert::{MAX_RANK, WG};
use super::snippets::{bits_fn, compute_ty, load_fn, pack_word};

/// Which elementwise op a [`Binary`] kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a * b`.
    Mul,
    /// `a * scalar`; `b` is unused.
    Scale,
}

/// An elementwise kernel: `out = op(a, b)` with `a` and `b` read through strides (broadcast),
/// written contiguously.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Binary {
    /// The op.
    pub op: BinaryOp,
    /// Dtype of both inputs and the output (one of [`BINARY_DTYPES`]).
    pub dtype: DType,
}

/// Dtypes the elementwise ops support.
pub const BINARY_DTYPES: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32];

impl Binary {
    /// Every op for every dtype in [`BINARY_DTYPES`].
    pub fn all() -> Vec<Binary> {
        let mut v = Vec::new();
        for dtype in BINARY_DTYPES {
            for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Scale] {
                v.push(Binary { op, dtype });
            }
        }
        v
    }

    /// The WGSL. Bindings `a` (and `b` unless [`BinaryOp::Scale`]) read, `out` written, all
    /// `array<u32>`; parameters `numel`, `scalar` (the bits of the scale), element offsets, the
    /// output shape right-aligned into `d0..d5` and per-input strides in elements.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let name = format!("{:?}_{}", self.op, self.dtype).to_lowercase();
        let ty = compute_ty(self.dtype);
        let mut pre = load_fn("a", self.dtype);
        pre.push_str(&bits_fn(self.dtype));
        let mut index = String::new();
        for (t, s) in [("a", "sa"), ("b", "sb")] {
            if self.op == BinaryOp::Scale && t == "b" {
                continue;
            }
            index.push_str(&format!("fn idx_{t}(e: u32) -> u32 {{\n    var rem = e;\n    var idx = p.off_{t};\n"));
            for d in (0..MAX_RANK).rev() {
                index.push_str(&format!("    idx += (rem % p.d{d}) * p.{s}{d};\n    rem = rem / p.d{d};\n"));
            }
            index.push_str("    return idx;\n}\n");
        }
        pre.push_str(&index);
        let scalar = match ty {
            "f32" => "bitcast<f32>(p.scalar)",
            "i32" => "bitcast<i32>(p.scalar)",
            _ => "p.scalar",
        };
        let value = match self.op {
            BinaryOp::Add => "ld_a(idx_a(e)) + ld_b(idx_b(e))".to_string(),
            BinaryOp::Mul => "ld_a(idx_a(e)) * ld_b(idx_b(e))".to_string(),
            BinaryOp::Scale => format!("ld_a(idx_a(e)) * {scalar}"),
        };
        let mut b = KernelBuilder::new(name, *env).workgroup(WG, 1, 1).storage("a", Access::Read, "array<u32>");
        let mut params = vec!["numel", "scalar", "off_a", "off_b", "d0", "d1", "d2", "d3", "d4", "d5"];
        params.extend(["sa0", "sa1", "sa2", "sa3", "sa4", "sa5"]);
        if self.op != BinaryOp::Scale {
            b = b.storage("b", Access::Read, "array<u32>");
            pre.push_str(&load_fn("b", self.dtype));
            params.extend(["sb0", "sb1", "sb2", "sb3", "sb4", "sb5"]);
        }
        let body = format!(
            "    let w = wg_linear * {WG}u + lidx;\n    if (w * {per}u >= p.numel) {{ return; }}\n    {}    out[w] = word;\n",
            pack_word(self.dtype, &value, "w", "p.numel"),
            per = self.dtype.per_word()
        );
        b.storage("out", Access::ReadWrite, "array<u32>").params(&params).prelude(&pre).body(&body).build()
    }
}
