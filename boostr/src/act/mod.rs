//! Activations on f32: SiLU and GELU (tanh approximation, as Gemma uses), alone or as a gated
//! linear unit `act(gate) * up` (SwiGLU, GeGLU), with the gate and up either in two tensors or
//! packed in one `[gate | up]` row (a fused gate/up projection's output).
//!
//! [`ActPlan`] is the op built once and recorded per step (`step.n_tok` rows of a width fixed at
//! build); [`Act::run`] is the eager path over tensors, built on the same plan.

mod plan;

pub use plan::{ActIo, ActPlan};

use crate::ops_common::OpPlan;
use numr::gpu::{Access, GpuContext, KernelBuilder, KernelEnv, KernelSource, StepValues};
use numr::{DType, Tensor};

use crate::ops_common::{Result, SAFE_TANH, bad, tensor_view, to_u32};

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
    /// The nonlinearity.
    pub kind: ActKind,
    /// Plain activation or a GLU, and where its gate and up values come from.
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

    /// `silu` / `gelu_tanh` (for kernel names).
    pub fn name(self) -> &'static str {
        match self {
            ActKind::Silu => "silu",
            ActKind::GeluTanh => "gelu_tanh",
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
    /// Every kind with every input (the variants the tests validate with naga).
    pub fn all() -> Vec<Act> {
        let mut v = Vec::new();
        for kind in [ActKind::Silu, ActKind::GeluTanh] {
            for input in [GluInput::None, GluInput::TwoTensors, GluInput::Packed] {
                v.push(Act { kind, input });
            }
        }
        v
    }

    /// WGSL over scalars ([`Act::source_vec`] with `vec4 = false`).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        self.source_vec(env, false)
    }

    /// WGSL. Bindings `a`, `b`, `out`; params `total, n, a_off, a_stride, b_off, b_stride,
    /// out_off`. With `vec4` every binding is an array of `vec4<f32>`, each invocation produces
    /// four outputs, and every parameter counts `vec4`s ([`ActPlan`] takes it when `n` and every
    /// offset are multiples of 4).
    ///
    /// Bounds: invocation `i < total` (rows = `total / n`) reads `a[a_off + r * a_stride + c]`
    /// (and `+ n` when packed), `b[b_off + r * b_stride + c]` and writes `out[out_off + i]`;
    /// [`ActPlan::new`] checks every binding holds its extent for the largest step.
    pub fn source_vec(&self, env: &KernelEnv, vec4: bool) -> KernelSource {
        let name = format!("act_{:?}_{:?}{}", self.kind, self.input, if vec4 { "_v4" } else { "" }).to_lowercase();
        let f = if vec4 { "act4" } else { "act" };
        let value = match self.input {
            GluInput::None => format!("{f}(a[ab + c])"),
            GluInput::TwoTensors => format!("{f}(a[ab + c]) * b[p.b_off + r * p.b_stride + c]"),
            GluInput::Packed => format!("{f}(a[ab + c]) * a[ab + p.n + c]"),
        };
        let body = format!(
            "    let i = wg_linear * 256u + lidx;\n    if (i >= p.total) {{ return; }}\n    let r = i / p.n;\n    let c = i - r * p.n;\n    let ab = p.a_off + r * p.a_stride;\n    out[p.out_off + i] = {value};\n"
        );
        let arr = if vec4 { "array<vec4<f32>>" } else { "array<f32>" };
        let act4 = if vec4 { "fn act4(v: vec4<f32>) -> vec4<f32> { return vec4<f32>(act(v.x), act(v.y), act(v.z), act(v.w)); }\n" } else { "" };
        KernelBuilder::new(name, *env)
            .workgroup(256, 1, 1)
            .storage("a", Access::Read, arr)
            .storage("b", Access::Read, arr)
            .storage("out", Access::ReadWrite, arr)
            .params(&["total", "n", "a_off", "a_stride", "b_off", "b_stride", "out_off"])
            .prelude(SAFE_TANH)
            .prelude(self.kind.wgsl())
            .prelude(act4)
            .body(&body)
            .build()
    }

    /// Width of one input row of `a` for output rows of `n`: `2n` when packed.
    pub fn input_width(&self, n: usize) -> usize {
        if self.input == GluInput::Packed { 2 * n } else { n }
    }

    /// Runs on GPU tensors (eagerly, through an [`ActPlan`] built for this call). `a` is
    /// `[rows, n]` (`[rows, 2n]` when packed), `b` `[rows, n]` for two-tensor GLUs, all f32 and
    /// contiguous. Returns `[rows, n]` f32.
    pub fn run(&self, ctx: &GpuContext, a: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
        const OP: &str = "act";
        let w = *a.shape().last().ok_or_else(|| bad(OP, "the input is a scalar"))?;
        let n = if self.input == GluInput::Packed { w / 2 } else { w };
        if n == 0 || self.input_width(n) != w {
            return Err(bad(OP, format!("input rows of {w} for {:?} (even and positive when packed)", self.input)));
        }
        let rows = a.numel() / w;
        if (self.input == GluInput::TwoTensors) != b.is_some() {
            return Err(bad(OP, format!("up tensor given: {}; the variant takes one: {}", b.is_some(), self.input == GluInput::TwoTensors)));
        }
        if let Some(b) = b.filter(|b| b.numel() != rows * n) {
            return Err(bad(OP, format!("the up tensor has {} elements, {rows} x {n} expected", b.numel())));
        }
        let out = Tensor::zeros(&[rows, n], DType::F32, a.device())?;
        if rows == 0 {
            return Ok(out);
        }
        let io = ActIo {
            a: tensor_view(OP, "the input", a, DType::F32)?,
            b: b.map(|b| tensor_view(OP, "the up tensor", b, DType::F32)).transpose()?,
            out: Some(tensor_view(OP, "out", &out, DType::F32)?),
        };
        let plan = ActPlan::new(ctx, self, &io, n, rows)?;
        plan.run(ctx, &StepValues::chunk(0, to_u32(OP, "rows", rows)?))?;
        Ok(out)
    }

    /// CPU reference over `rows` rows of `n` outputs (`a` holds `rows x input_width(n)`, `b`
    /// `rows x n` for two-tensor GLUs). Lengths that disagree are
    /// [`crate::ops_common::OpsError::BadArgs`].
    pub fn reference(&self, a: &[f32], b: Option<&[f32]>, rows: usize, n: usize) -> Result<Vec<f32>> {
        const OP: &str = "act reference";
        let w = self.input_width(n);
        if a.len() != rows * w {
            return Err(bad(OP, format!("input of {} elements, {rows} x {w} expected", a.len())));
        }
        let up = match (self.input, b) {
            (GluInput::TwoTensors, Some(b)) if b.len() == rows * n => b,
            (GluInput::TwoTensors, b) => return Err(bad(OP, format!("up of {:?} elements, {rows} x {n} expected", b.map(|b| b.len())))),
            _ => &[][..],
        };
        let mut out = Vec::with_capacity(rows * n);
        for r in 0..rows {
            for c in 0..n {
                let v = match self.input {
                    GluInput::None => self.kind.apply(a[r * n + c] as f64),
                    GluInput::TwoTensors => self.kind.apply(a[r * n + c] as f64) * up[r * n + c] as f64,
                    GluInput::Packed => self.kind.apply(a[r * 2 * n + c] as f64) * a[r * 2 * n + n + c] as f64,
                };
                out.push(v as f32);
            }
        }
        Ok(out)
    }
}
