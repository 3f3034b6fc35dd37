//! [`KvWritePlan`]: stores K/V rows produced outside the fused QK-norm + RoPE path (f16 or q8_0
//! cache), built once per layer and recorded per step. It is the fused kernel with rotation and
//! norm off, so the rows are rounded exactly as the fused path rounds them.

use crate::ops_common::OpPlan;
use numr::gpu::{Binding, GpuContext, Plan, StepValues};

use super::KvCache;
use crate::ops_common::Result;
use crate::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};

/// Stores token `t`'s K and V heads (read from `x`) at cache slot `step.pos + t` of one layer, one
/// dispatch per cache segment the step touches. `x` is only read.
#[derive(Clone, Debug)]
pub struct KvWritePlan {
    inner: QkvRopePlan,
}

impl KvWritePlan {
    /// `layout` says where token `t`'s K heads (`k_off`) and V heads (`v_off`) sit in `x` (its Q
    /// heads are ignored; `layout.n_tok` is the most tokens one step carries). Typed errors for a
    /// layout that does not match the cache, a layer it lacks, or an `x` binding too short.
    pub fn new(ctx: &GpuContext, x: &Binding, layout: &QkvLayout, cache: &KvCache, layer: usize) -> Result<KvWritePlan> {
        let c = cache.config();
        let cfg = QkvRope { style: RopeStyle::Neox, rope: false, qk_norm: false, norm_offset: false, kv_write: Some(c.dtype) };
        let layout = QkvLayout { n_q: 0, q_off: 0, ..*layout };
        let rope = RopeParams { head_dim: layout.head_dim, rot_dim: 0, base: 1.0, scaling: RopeScaling::None, style: RopeStyle::Neox };
        let inp = QkvRopeInputs { x, layout, rope: &rope, positions: &RopePositions::Step, qw: None, kw: None, eps: 0.0, cache: Some((cache, layer)) };
        Ok(KvWritePlan { inner: QkvRopePlan::new(ctx, &cfg, &inp)? })
    }
}

impl OpPlan for KvWritePlan {
    /// At most the layout's tokens, slots inside the cache
    /// ([`crate::ops_common::OpsError::ContextOverflow`]).
    fn check(&self, step: &StepValues) -> Result<()> {
        self.inner.check(step)
    }

    /// The underlying plan (see [`QkvRopePlan`]).
    fn plan(&self) -> &Plan {
        self.inner.plan()
    }
}
