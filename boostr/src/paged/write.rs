//! [`PagedKvWrite`]: stores each token's K and V heads at its position, through its sequence's
//! block table, and [`PagedKvWritePlan`], one dispatch per buffer of a layer.

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, StepValues};

use super::{PagedBatch, PagedKvCache, PagedKvConfig};
use crate::kv_cache::KvDtype;
use crate::ops_common::{OpPlan, OpsError, Result, bad, env_of, to_u32};

/// Invocations per write workgroup (one row of one head).
const WRITE_WG: u32 = 64;

/// The write kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedKvWrite {
    /// Values per head row.
    pub head_dim: u32,
    /// Storage of the cache.
    pub dtype: KvDtype,
}

impl PagedKvWrite {
    /// Every variant the tests validate with naga: each head size of each storage type.
    pub fn all() -> Vec<PagedKvWrite> {
        let mut v = Vec::new();
        for dtype in [KvDtype::F16, KvDtype::Q8_0] {
            for head_dim in (8..=256).step_by(8).filter(|&h| PagedKvConfig::supports_head_dim(dtype, h)) {
                v.push(PagedKvWrite { head_dim: head_dim as u32, dtype });
            }
        }
        v
    }

    /// WGSL. Bindings `x` (the rows), `tok`, `tables`, `kc`, `vc` (rw). Grid `[n_kv, 2, n_tok]`:
    /// workgroup `(h, kv, t)` stores token `t`'s K (`kv = 0`) or V head `h` at its position, when
    /// the position's block lives in the bound buffer (blocks `blk_base .. blk_base + blk_count`).
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        let hd = self.head_dim;
        if !PagedKvConfig::supports_head_dim(self.dtype, hd as usize) {
            return Err(OpsError::Unsupported { what: "paged KV write", reason: format!("head size {hd} as {}", self.dtype) });
        }
        let mut pre = format!("var<workgroup> row: array<f32, {hd}>;\nvar<workgroup> s_blk: u32;\nvar<workgroup> s_pos: u32;\n");
        pre.push_str(&self.dtype.store_fn("kc", WRITE_WG));
        pre.push_str(&self.dtype.store_fn("vc", WRITE_WG));
        let body = format!(
            "    let h = wid.x;
    let t = wid.z;
    if (lidx == 0u) {{
        let pos = tok[2u * t + 1u];
        s_pos = pos;
        s_blk = tables[tok[2u * t] + pos / p.block_len];
    }}
    let local = workgroupUniformLoad(&s_blk) - p.blk_base;
    let pos = workgroupUniformLoad(&s_pos);
    if (local >= p.blk_count) {{ return; }}
    let src = p.x_off + t * p.tok_stride + select(p.k_off, p.v_off, wid.y == 1u) + h * {hd}u;
    for (var e = lidx; e < {hd}u; e += {WRITE_WG}u) {{ row[e] = x[src + e]; }}
    workgroupBarrier();
    let base = ((local * p.n_kv + h) * p.block_len + pos % p.block_len) * {rw}u;
    if (wid.y == 0u) {{ store_kc(base, lidx); }} else {{ store_vc(base, lidx); }}
",
            rw = self.dtype.row_words(hd as usize)
        );
        let name = format!("paged_kv_write_hd{hd}_{}", self.dtype);
        Ok(KernelBuilder::new(name, *env)
            .workgroup(WRITE_WG, 1, 1)
            .storage("x", Access::Read, "array<f32>")
            .storage("tok", Access::Read, "array<u32>")
            .storage("tables", Access::Read, "array<u32>")
            .storage("kc", Access::ReadWrite, "array<u32>")
            .storage("vc", Access::ReadWrite, "array<u32>")
            .params(&["hd", "x_off", "tok_stride", "k_off", "v_off", "n_kv", "block_len", "blk_base", "blk_count"])
            .prelude(&pre)
            .body(&body)
            .build())
    }
}

/// Where each token's K and V heads sit in the binding the write reads (f32 elements): token
/// `t`'s K head `h` at `x_off + t * tok_stride + k_off + h * head_dim`, its V heads from `v_off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedRowsLayout {
    /// Element of token 0.
    pub x_off: usize,
    /// Elements from one token to the next.
    pub tok_stride: usize,
    /// K heads' offset inside a token.
    pub k_off: usize,
    /// V heads' offset inside a token.
    pub v_off: usize,
}

/// Stores a step's K/V rows into one layer of a paged cache through the batch's tables, built once
/// and recorded per step with `n_tok` = the batch's tokens (positions and tables come from the
/// [`PagedBatch`]).
#[derive(Clone, Debug)]
pub struct PagedKvWritePlan {
    plan: Plan,
    max_tok: u32,
}

impl PagedKvWritePlan {
    /// Typed errors for a layer the cache lacks, or an `x` binding shorter than the layout reads
    /// for the batch's most tokens.
    pub fn new(ctx: &GpuContext, x: &Binding, layout: &PagedRowsLayout, cache: &PagedKvCache, layer: usize, batch: &PagedBatch) -> Result<PagedKvWritePlan> {
        const OP: &str = "paged KV write";
        let c = *cache.config();
        let hd = c.head_dim;
        let row_end = |off: usize| off.checked_add(c.n_kv_heads * hd);
        let last = (batch.max_tokens() - 1)
            .checked_mul(layout.tok_stride)
            .and_then(|v| v.checked_add(layout.x_off))
            .and_then(|v| v.checked_add(row_end(layout.k_off)?.max(row_end(layout.v_off)?)))
            .ok_or_else(|| bad(OP, "layout overflows"))?;
        if (last as u64).saturating_mul(4) > x.size {
            return Err(bad(OP, format!("x binding of {} bytes, the layout reads {last} f32", x.size)));
        }
        let max_tok = to_u32(OP, "tokens", batch.max_tokens())?;
        let n_kv = to_u32(OP, "KV heads", c.n_kv_heads)?;
        let kernel = ctx.kernel(&PagedKvWrite { head_dim: to_u32(OP, "head size", hd)?, dtype: c.dtype }.source(&env_of(ctx))?)?;
        let mut plan = Plan::new();
        for buf in cache.buffers(layer)? {
            let b = [x.clone(), batch.tok_binding(), batch.table_binding(), Binding::whole(&buf.k), Binding::whole(&buf.v)];
            let d = PlanDispatch::new(&kernel, ctx.bind(&kernel, &b)?, [n_kv, 2, 0])?
                .set_usize("hd", hd)?
                .set_usize("x_off", layout.x_off)?
                .set_usize("tok_stride", layout.tok_stride)?
                .set_usize("k_off", layout.k_off)?
                .set_usize("v_off", layout.v_off)?
                .set("n_kv", n_kv)?
                .set_usize("block_len", c.block_len)?
                .set_usize("blk_base", buf.first_block)?
                .set_usize("blk_count", buf.n_blocks)?
                .grid_per_step(move |s| [n_kv, 2, s.n_tok.min(max_tok)]);
            plan.push(d);
        }
        Ok(PagedKvWritePlan { plan, max_tok })
    }
}

impl OpPlan for PagedKvWritePlan {
    /// At most the batch's tokens.
    fn check(&self, step: &StepValues) -> Result<()> {
        if step.n_tok == 0 || step.n_tok > self.max_tok {
            return Err(bad("paged KV write", format!("{} tokens in a step (1..={})", step.n_tok, self.max_tok)));
        }
        Ok(())
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}
