//! Activations on f32: SiLU and GELU (tanh approximation, as Gemma uses), alone or as a gated
//! linear unit `act(gate) * up` (SwiGLU, GeGLU), with the gate and up either in two tensors or
//! packed in one `[gate | up]` row (a fused gate/up projection's output).

use numr::gpu::{Access, GpuContext, KernelBuilder, KernelEnv, KernelSource};
use numr::{DType, Tensor};

use crate::ops_common::{Result, SAFE_TANH, bad, bind, dispatch, dummy, env_of, grid_for};

/// The nonlinearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActKind {
    /// `x * sigmoid(x)`.
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³)))`.
    GeluTanh,
}

/// Where the inputs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluInput {
    /// Plain activation `act(x)`.
    None,
    /// `act(gate) * up` from two tensors of `[rows, n]`.
    TwoTensors,
    /// `act(row[..n]) * row[n..2n]` from one `[rows, 2n]` tensor.
    Packed,
}

/// An activation kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Act {
    pub kind: ActKind,
    pub input: GluInput,
}

impl ActKind {
    /// CPU reference of the nonlinearity (f64).
    pub fn apply(self, x: f64) -> f64 {
        match self {
            ActKind::Silu => x / (1.0 + (-x).exp()),
            ActKind::GeluTanh => 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
        }
    }

    /// WGSL `fn act(x: f32) -> f32` (needs [`SAFE_TANH`]).
    pub fn wgsl(self) -> &'static str {
        match self {
            ActKind::Silu => "fn act(x: f32) -> f32 { return x / (1.0 + exp(-x)); }\n",
            ActKind::GeluTanh => "fn act(x: f32) -> f32 { return 0.5 * x * (1.0 + tanh_s(0.7978845608028654 * (x + 0.044715 * x * x * x))); }\n",
        }
    }
}

impl Act {
    pub fn all() -> Vec<Act> {
        let mut v = Vec::new();
        for kind in [ActKind::Silu, ActKind::GeluTanh] {
            for input in [GluInput::None, GluInput::TwoTensors, GluInput::Packed] {
                v.push(Act { kind, input });
            }
        }
        v
    }

    /// WGSL. Bindings `a`, `b`, `out`; params `total, n, a_off, a_stride, b_off, b_stride`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let name = format!("act_{:?}_{:?}", self.kind, self.input).to_lowercase();
        let value = match self.input {
            GluInput::None => "act(a[ab + c])",
            GluInput::TwoTensors => "act(a[ab + c]) * b[p.b_off + r * p.b_stride + c]",
            GluInput::Packed => "act(a[ab + c]) * a[ab + p.n + c]",
        };
        let body = format!(
            "    let i = wg_linear * 256u + lidx;\n    if (i >= p.total) {{ return; }}\n    let r = i / p.n;\n    let c = i - r * p.n;\n    let ab = p.a_off + r * p.a_stride;\n    out[i] = {value};\n"
        );
        KernelBuilder::new(name, *env)
            .workgroup(256, 1, 1)
            .storage("a", Access::Read, "array<f32>")
            .storage("b", Access::Read, "array<f32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["total", "n", "a_off", "a_stride", "b_off", "b_stride"])
            .prelude(SAFE_TANH)
            .prelude(self.kind.wgsl())
            .body(&body)
            .build()
    }

    /// Runs on GPU tensors. `a` is `[rows, n]` (`[rows, 2n]` when packed), `b` `[rows, n]` for
    /// two-tensor GLUs. Returns `[rows, n]` f32.
    pub fn run(&self, ctx: &GpuContext, a: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
        let w = *a.shape().last().ok_or_else(|| bad("act", "scalar input"))?;
        let rows = a.numel() / w.max(1);
        let n = if self.input == GluInput::Packed { w / 2 } else { w };
        if (self.input == GluInput::TwoTensors) != b.is_some() || b.is_some_and(|b| b.numel() != rows * n) {
            return Err(bad("act", "the up tensor does not match the variant or the shape"));
        }
        let out = Tensor::zeros(&[rows, n], DType::F32, a.device())?;
        let (ab, ao) = bind(a)?;
        let (bb, bo) = match b {
            Some(b) => bind(b)?,
            None => (dummy(ctx)?, 0),
        };
        let total = (rows * n) as u32;
        let params = [total, n as u32, ao, w as u32, bo, n as u32];
        dispatch(ctx, &self.source(&env_of(ctx)), &[ab, bb, bind(&out)?.0], &params, grid_for(ctx, (total as u64).div_ceil(256))?)?;
        Ok(out)
    }

    /// CPU reference.
    pub fn reference(&self, a: &[f32], b: Option<&[f32]>, rows: usize, n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows * n);
        for r in 0..rows {
            for c in 0..n {
                let v = match self.input {
                    GluInput::None => self.kind.apply(a[r * n + c] as f64),
                    GluInput::TwoTensors => self.kind.apply(a[r * n + c] as f64) * b.expect("up")[r * n + c] as f64,
                    GluInput::Packed => self.kind.apply(a[r * 2 * n + c] as f64) * a[r * 2 * n + n + c] as f64,
                };
                out.push(v as f32);
            }
        }
        out
    }
}
