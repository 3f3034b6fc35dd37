//! Masking listed ids out of a logits row, in place: `logits[id] = -f32::MAX` for each listed
//! id below the vocabulary, so that argmax and top-k never choose them (the engine's
//! `ignore_eos` with greedy decoding on the GPU). One dispatch of one workgroup per 256 ids.

use crate::ops_common::OpPlan;
use numr::gpu::{Access, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch};

use crate::ops_common::{GpuView, Result, bad, env_of, to_u32};

/// The mask kernel (in place on the logits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mask;

impl Mask {
    /// WGSL. Bindings `logits` (rw), `ids`; params `n, l_off, i_off, count`.
    ///
    /// Bounds: invocation `i < count` reads `ids[i_off + i]` and, when the id is below `n`,
    /// writes `logits[l_off + id]`; [`MaskPlan::new`] checks both views.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("mask_ids", *env)
            .workgroup(256, 1, 1)
            .storage("logits", Access::ReadWrite, "array<f32>")
            .storage("ids", Access::Read, "array<u32>")
            .params(&["n", "l_off", "i_off", "count"])
            .body(
                "    let i = wg_linear * 256u + lidx;
    if (i >= p.count) { return; }
    let id = ids[p.i_off + i];
    if (id < p.n) { logits[p.l_off + id] = -3.4028235e38; }
",
            )
            .build()
    }
}

/// Sets the logits of `count` ids (read from `ids`) to `-f32::MAX`, in place on `n` logits; ids
/// at or past `n` are skipped. One dispatch; the same at every step.
#[derive(Clone, Debug)]
pub struct MaskPlan {
    plan: Plan,
}

impl MaskPlan {
    /// Builds the plan over `logits` (`n` f32) and `ids` (`count` u32, at least one).
    pub fn new(ctx: &GpuContext, logits: &GpuView, n: usize, ids: &GpuView, count: usize) -> Result<MaskPlan> {
        const OP: &str = "mask plan";
        if n == 0 || count == 0 {
            return Err(bad(OP, format!("{n} logits and {count} ids (both must be positive)")));
        }
        logits.need(OP, "the logits", n)?;
        ids.need(OP, "the ids", count)?;
        let kernel = ctx.kernel(&Mask.source(&env_of(ctx)))?;
        let group = ctx.bind(&kernel, &[logits.binding.clone(), ids.binding.clone()])?;
        let groups = to_u32(OP, "workgroups", count.div_ceil(256))?;
        let d = PlanDispatch::new(&kernel, group, [groups, 1, 1])?
            .set_usize("n", n)?
            .set("l_off", logits.offset_u32(OP)?)?
            .set("i_off", ids.offset_u32(OP)?)?
            .set_usize("count", count)?;
        Ok(MaskPlan { plan: Plan::from(d) })
    }
}

impl OpPlan for MaskPlan {
    fn check(&self, _step: &numr::gpu::StepValues) -> Result<()> {
        Ok(())
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

/// The CPU reference: the same in place on a row.
pub fn mask_ref(logits: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = -f32::MAX;
        }
    }
}
