//! The block every quantized plan ends with ([`super::GemvPlan`], [`super::Q8GemvPlan`],
//! [`super::GemmPlan`]): compile the config's kernel once, without naga's bounds checks when the
//! config is `unchecked`, then one dispatch per part of the matrix, bound to the plan's own
//! bindings around the part's buffer and given the part's parameters ([`set_part`],
//! [`set_out_cols`]).

use numr::gpu::{Binding, GpuContext, KernelSource, Plan, PlanDispatch};

use super::gemv_output::set_out_cols;
use super::kernel_common::set_part;
use super::{QuantMatrix, QuantPart, Result};

/// A plan's kernel and what it binds around each part of the matrix.
pub(crate) struct PartKernel {
    /// The config's (checked) source.
    pub src: KernelSource,
    /// Compile it without bounds checks (the config's `unchecked`).
    pub unchecked: bool,
    /// Bound ahead of the part's buffer.
    pub before: Vec<Binding>,
    /// Bound after it.
    pub after: Vec<Binding>,
    /// Where the part's outputs go: `(n_out, first column)` ([`super::gemv_output::out_cols`]).
    pub cols: (usize, usize),
}

impl PartKernel {
    /// Compiles the kernel and builds one dispatch per part of `w`, in order: bound to `before`,
    /// the part's buffer twice (the kernel's `wv` and `ws`) and `after`, on `grid(i, part)`, with
    /// the part's parameters and then `params(i, part, dispatch)`'s.
    ///
    /// # Safety
    /// With `unchecked`, every dispatch of the kernel indexes only inside what it binds: the
    /// caller has validated every binding and parameter the kernel's bounds invariant needs
    /// (stated at each call).
    pub(crate) unsafe fn plan(
        self,
        ctx: &GpuContext,
        w: &QuantMatrix,
        mut grid: impl FnMut(usize, &QuantPart) -> Result<[u32; 3]>,
        mut params: impl FnMut(usize, &QuantPart, PlanDispatch) -> Result<PlanDispatch>,
    ) -> Result<Plan> {
        // SAFETY: the caller's contract (above).
        let src = if self.unchecked { unsafe { self.src.assume_in_bounds() } } else { self.src };
        let kernel = ctx.kernel(&src)?;
        let mut plan = Plan::new();
        for (i, part) in w.parts.iter().enumerate() {
            let mut bind = self.before.clone();
            bind.extend([part.binding(), part.binding()]);
            bind.extend(self.after.iter().cloned());
            let group = ctx.bind(&kernel, &bind)?;
            let d = PlanDispatch::new(&kernel, group, grid(i, part)?)?;
            plan.push(params(i, part, set_out_cols(set_part(d, w, part)?, part, self.cols)?)?);
        }
        Ok(plan)
    }
}
