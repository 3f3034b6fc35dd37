//! Plans: GPU work built once and recorded any number of times.
//!
//! A [`Plan`] is a list of [`PlanDispatch`]es, each a compiled kernel, a bind group built once, its
//! parameter words filled **by name**, and a grid. Values that change from one step to the next
//! (the position, the token count, the KV length, the slot of a GPU id buffer) are not baked in:
//! a dispatch declares which of its parameters (and its grid) follow from the [`StepValues`]
//! given to [`Plan::record`]. Recording a plan creates no buffer and no bind group; it only
//! appends dispatches to a [`Recorder`] (whose parameter words travel as immediates or through
//! the uniform arena).
//!
//! Every op in boostr builds one of these, so an engine builds all its plans at load and records
//! a whole token from them.
//!
//! ```no_run
//! # use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, Plan, PlanDispatch, StepValues};
//! # fn main() -> numr::Result<()> {
//! let ctx = GpuContext::new()?;
//! let env = KernelEnv::from_caps(ctx.capabilities());
//! let src = KernelBuilder::new("put_pos", env)
//!     .storage("x", Access::ReadWrite, "array<u32>")
//!     .params(&["n", "pos"])
//!     .body("    if (lidx < p.n) { x[lidx] = p.pos; }\n")
//!     .build();
//! let kernel = ctx.kernel(&src)?;
//! let buf = ctx.upload(&[0u8; 64])?;
//! let group = ctx.bind(&kernel, &[Binding::whole(&buf)])?;
//! let plan = Plan::from(PlanDispatch::new(&kernel, group, [1, 1, 1])?.set("n", 16)?.per_step("pos", |s| s.pos)?);
//! let mut rec = ctx.recorder();
//! for pos in 5..8 {
//!     plan.record(&mut rec, &StepValues::decode(pos))?;
//! }
//! rec.submit()?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use super::pipeline::{BoundGroup, Kernel};
use super::recorder::Recorder;
use crate::error::{NumrError, Result};

/// The values that change from one recording of a plan to the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StepValues {
    /// Position (in the sequence) of the step's first token; also the first KV slot written.
    pub pos: u32,
    /// Tokens in the step (1 for decode, the chunk length for prefill).
    pub n_tok: u32,
    /// Index into GPU-resident token buffers (the ids an embedding reads, the slot an argmax
    /// writes): lets a decode loop keep a ring of ids on the GPU.
    pub token: u32,
    /// A batched step of several sequences (their positions in a GPU buffer): the longest KV
    /// length any of them reaches; 0 for a step of one sequence (see [`Self::kv_max`]).
    pub batch_kv: u32,
    /// A batched step: how many of its first rows are decode rows (generated tokens, not a
    /// prompt's), which a batched op may compute with kernels of their own (a multi-row GEMV
    /// beside the GEMM of the prompt rows); 0 otherwise (see [`Self::with_decode_rows`]).
    pub decode_rows: u32,
}

impl StepValues {
    /// One token at `pos` (id slot 0).
    pub const fn decode(pos: u32) -> Self {
        StepValues { pos, n_tok: 1, token: 0, batch_kv: 0, decode_rows: 0 }
    }

    /// A chunk of `n_tok` tokens whose first sits at `pos` (id slot 0).
    pub const fn chunk(pos: u32, n_tok: u32) -> Self {
        StepValues { pos, n_tok, token: 0, batch_kv: 0, decode_rows: 0 }
    }

    /// The same step reading / writing GPU token slot `token`.
    pub const fn with_token(mut self, token: u32) -> Self {
        self.token = token;
        self
    }

    /// KV positions valid once the step's tokens are written: `pos + n_tok`.
    pub const fn kv_len(&self) -> u32 {
        self.pos + self.n_tok
    }

    /// A batched step of `n_tok` tokens of several sequences, the longest reaching `kv_max`
    /// positions (id slot 0; positions come from the batch's buffers, `pos` is 0).
    pub const fn batch(n_tok: u32, kv_max: u32) -> Self {
        StepValues { pos: 0, n_tok, token: 0, batch_kv: kv_max, decode_rows: 0 }
    }

    /// The same step whose first `rows` rows (at most `n_tok`) are decode rows.
    pub const fn with_decode_rows(mut self, rows: u32) -> Self {
        self.decode_rows = if rows < self.n_tok { rows } else { self.n_tok };
        self
    }

    /// The longest KV length of the step: [`Self::batch`]'s, else [`Self::kv_len`].
    pub const fn kv_max(&self) -> u32 {
        if self.batch_kv > 0 { self.batch_kv } else { self.kv_len() }
    }
}

/// A parameter word computed from the step values.
pub type StepParam = Arc<dyn Fn(&StepValues) -> u32 + Send + Sync>;
/// A grid computed from the step values (a zero dimension skips the dispatch for that step).
pub type StepGrid = Arc<dyn Fn(&StepValues) -> [u32; 3] + Send + Sync>;

/// One dispatch of a plan: kernel, bind group, named parameters and grid, made once.
#[derive(Clone)]
pub struct PlanDispatch {
    pub(crate) kernel: Arc<Kernel>,
    pub(crate) group: BoundGroup,
    pub(crate) params: Vec<u32>,
    pub(crate) per_step: Vec<(usize, StepParam)>,
    pub(crate) grid: [u32; 3],
    pub(crate) grid_fn: Option<StepGrid>,
}

impl std::fmt::Debug for PlanDispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanDispatch")
            .field("kernel", &self.kernel.name())
            .field("params", &self.params)
            .field("per_step", &self.per_step.iter().map(|(i, _)| &self.kernel.param_names()[*i]).collect::<Vec<_>>())
            .field("grid", &self.grid)
            .finish()
    }
}

impl PlanDispatch {
    /// A dispatch of `kernel` over `group` (built once with [`super::GpuContext::bind`]); every
    /// parameter starts at 0. Errors when the group was built for another binding layout.
    pub fn new(kernel: &Arc<Kernel>, group: BoundGroup, grid: [u32; 3]) -> Result<Self> {
        if group.layout_key != kernel.layout_key {
            return Err(NumrError::Validation {
                context: format!("building a plan for kernel {}", kernel.name()),
                message: "bind group was built for a different binding layout".into(),
            });
        }
        Ok(PlanDispatch { kernel: kernel.clone(), group, params: vec![0; kernel.param_words()], per_step: Vec::new(), grid, grid_fn: None })
    }

    fn index(&self, name: &str) -> Result<usize> {
        self.kernel.param_index(name).ok_or_else(|| NumrError::Validation {
            context: format!("building a plan for kernel {}", self.kernel.name()),
            message: format!("no parameter named {name:?} (it has {:?})", self.kernel.param_names()),
        })
    }

    /// Sets parameter `name` to a fixed word.
    pub fn set(mut self, name: &str, value: u32) -> Result<Self> {
        let i = self.index(name)?;
        self.params[i] = value;
        Ok(self)
    }

    /// Sets parameter `name` to a fixed f32 (read in WGSL as `bitcast<f32>(p.name)`).
    pub fn set_f32(self, name: &str, value: f32) -> Result<Self> {
        self.set(name, value.to_bits())
    }

    /// Sets parameter `name` to a size, checked to fit a u32 word.
    pub fn set_usize(self, name: &str, value: usize) -> Result<Self> {
        let v = u32::try_from(value).map_err(|_| NumrError::Validation {
            context: format!("building a plan for kernel {}", self.kernel.name()),
            message: format!("parameter {name} = {value} does not fit 32 bits"),
        })?;
        self.set(name, v)
    }

    /// Parameter `name` follows from the step values at each recording.
    pub fn per_step(mut self, name: &str, f: impl Fn(&StepValues) -> u32 + Send + Sync + 'static) -> Result<Self> {
        let i = self.index(name)?;
        self.per_step.retain(|(j, _)| *j != i);
        self.per_step.push((i, Arc::new(f)));
        Ok(self)
    }

    /// The grid follows from the step values (a zero dimension skips the dispatch).
    pub fn grid_per_step(mut self, f: impl Fn(&StepValues) -> [u32; 3] + Send + Sync + 'static) -> Self {
        self.grid_fn = Some(Arc::new(f));
        self
    }

    /// The kernel.
    pub fn kernel(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    /// The bind group.
    pub fn group(&self) -> &BoundGroup {
        &self.group
    }

    /// The fixed value of parameter `name` (per-step parameters read as their build-time 0).
    pub fn param(&self, name: &str) -> Option<u32> {
        self.kernel.param_index(name).map(|i| self.params[i])
    }

    /// The parameter words and grid this dispatch records for `step`, or `None` when it is
    /// skipped at that step.
    pub fn resolve(&self, step: &StepValues, words: &mut [u32]) -> Option<[u32; 3]> {
        words[..self.params.len()].copy_from_slice(&self.params);
        for (i, f) in &self.per_step {
            words[*i] = f(step);
        }
        let grid = self.grid_fn.as_ref().map_or(self.grid, |g| g(step));
        (grid.iter().all(|&g| g > 0)).then_some(grid)
    }

    /// Records the dispatch for `step`.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        let mut words = [0u32; super::kernel::MAX_PARAM_WORDS];
        match self.resolve(step, &mut words) {
            Some(grid) => rec.dispatch(&self.kernel, &self.group, &words[..self.params.len()], grid),
            None => Ok(()),
        }
    }
}

/// GPU work built once (kernels, bind groups, the buffers it writes are owned by the op that
/// built it) and recorded per step. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    dispatches: Vec<PlanDispatch>,
}

impl From<PlanDispatch> for Plan {
    fn from(d: PlanDispatch) -> Self {
        Plan { dispatches: vec![d] }
    }
}

impl Plan {
    /// An empty plan.
    pub fn new() -> Self {
        Plan::default()
    }

    /// Appends a dispatch.
    pub fn push(&mut self, d: PlanDispatch) {
        self.dispatches.push(d);
    }

    /// Appends another plan's dispatches (recorded after this plan's own).
    pub fn append(&mut self, other: &Plan) {
        self.dispatches.extend(other.dispatches.iter().cloned());
    }

    /// The dispatches.
    pub fn dispatches(&self) -> &[PlanDispatch] {
        &self.dispatches
    }

    /// Dispatches a recording of `step` adds (skipped ones excluded).
    pub fn dispatch_count(&self, step: &StepValues) -> usize {
        let mut words = [0u32; super::kernel::MAX_PARAM_WORDS];
        self.dispatches.iter().filter(|d| d.resolve(step, &mut words).is_some()).count()
    }

    /// True when the plan has no dispatches.
    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Records every dispatch for `step`, in order. Allocates no GPU memory and creates no bind
    /// group.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        for d in &self.dispatches {
            d.record(rec, step)?;
        }
        Ok(())
    }

    /// Records the plan for `step` into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &super::GpuContext, step: &StepValues) -> Result<()> {
        ctx.with_stream(|rec| self.record(rec, step))
    }
}
