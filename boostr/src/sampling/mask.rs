//! Masking listed ids out of a logits row, in place: `logits[id] = -f32::MAX` for each listed
//! id below the vocabulary, so that argmax and top-k never choose them (the engine's
//! `ignore_eos` with greedy decoding on the GPU). One dispatch of one workgroup per 256 ids.
//! [`MaskBitsPlan`] does the converse for a structured-output constraint: it keeps only the ids
//! an allowed-id bitmask sets, in up to one row per mask.

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

/// Workgroup size of [`MaskBits`]: each invocation owns one word (32 ids) of one row's mask.
const BITS_WG: u32 = 64;

/// The allowed-ids kernel (in place on the logits): a structured-output constraint's mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MaskBits;

impl MaskBits {
    /// WGSL. Bindings `logits` (rw), `bits`, `rows`; params `n, words, max_rows, l_off, b_off,
    /// r_off`; grid `[ceil(words / 64), count]`.
    ///
    /// Bounds: invocation `(w, i)` with `w < words` (tested) and `i` below the grid's rows reads
    /// `rows[r_off + i]` and `bits[b_off + i * words + w]` ([`MaskBitsPlan::new`] checks both
    /// views for its most masks), and writes `logits[l_off + row * n + id]` only for
    /// `row < max_rows` (tested: the row comes from memory) and `id < n`; the plan checks that
    /// the logits hold `max_rows * n`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("mask_bits", *env)
            .workgroup(BITS_WG, 1, 1)
            .storage("logits", Access::ReadWrite, "array<f32>")
            .storage("bits", Access::Read, "array<u32>")
            .storage("rows", Access::Read, "array<u32>")
            .params(&["n", "words", "max_rows", "l_off", "b_off", "r_off"])
            .body(
                "    let w = wid.x * 64u + lidx;
    let i = wid.y;
    if (w >= p.words) { return; }
    let allowed = bits[p.b_off + i * p.words + w];
    if (allowed == 0xffffffffu) { return; }
    let row = rows[p.r_off + i];
    if (row >= p.max_rows) { return; }
    let base = p.l_off + row * p.n;
    for (var b = 0u; b < 32u; b++) {
        let id = w * 32u + b;
        if (id < p.n && ((allowed >> b) & 1u) == 0u) { logits[base + id] = -3.4028235e38; }
    }
",
            )
            .build()
    }
}

/// Applies allowed-id bitmasks to logits rows, in place: mask `i` (`ceil(n / 32)` words, bit
/// `id % 32` of word `id / 32` set where `id` is allowed) goes to the logits row `rows[i]`, and
/// every id it does not allow gets `-f32::MAX`, so that argmax and top-k choose among the
/// allowed ids only (a structured-output constraint's mask, with no logits read back). A step
/// applies the first [`StepValues::n_tok`](numr::gpu::StepValues) masks (0: none, skipped); the
/// host writes the masks and their rows before it.
#[derive(Clone, Debug)]
pub struct MaskBitsPlan {
    plan: Plan,
    max_masks: usize,
}

impl MaskBitsPlan {
    /// Builds the plan over `logits` (`max_rows` rows of `n` f32), `bits` (`max_masks` masks of
    /// `ceil(n / 32)` u32) and `rows` (`max_masks` u32: each mask's logits row).
    pub fn new(ctx: &GpuContext, logits: &GpuView, n: usize, max_rows: usize, bits: &GpuView, rows: &GpuView, max_masks: usize) -> Result<MaskBitsPlan> {
        const OP: &str = "mask bits plan";
        if n == 0 || max_rows == 0 || max_masks == 0 {
            return Err(bad(OP, format!("{n} logits, {max_rows} rows and {max_masks} masks (all must be positive)")));
        }
        let words = n.div_ceil(32);
        logits.need(OP, "the logits", n.checked_mul(max_rows).ok_or_else(|| bad(OP, "the logits overflow"))?)?;
        bits.need(OP, "the masks", words.checked_mul(max_masks).ok_or_else(|| bad(OP, "the masks overflow"))?)?;
        rows.need(OP, "the mask rows", max_masks)?;
        to_u32(OP, "logits", n * max_rows)?;
        let kernel = ctx.kernel(&MaskBits.source(&env_of(ctx)))?;
        let group = ctx.bind(&kernel, &[logits.binding.clone(), bits.binding.clone(), rows.binding.clone()])?;
        let gx = to_u32(OP, "workgroups", words.div_ceil(BITS_WG as usize))?;
        let most = to_u32(OP, "masks", max_masks)?;
        let d = PlanDispatch::new(&kernel, group, [gx, 1, 1])?
            .set_usize("n", n)?
            .set_usize("words", words)?
            .set_usize("max_rows", max_rows)?
            .set("l_off", logits.offset_u32(OP)?)?
            .set("b_off", bits.offset_u32(OP)?)?
            .set("r_off", rows.offset_u32(OP)?)?
            .grid_per_step(move |s| [gx, s.n_tok.min(most), 1]);
        Ok(MaskBitsPlan { plan: Plan::from(d), max_masks })
    }

    /// The most masks a step applies.
    pub fn max_masks(&self) -> usize {
        self.max_masks
    }
}

impl OpPlan for MaskBitsPlan {
    fn check(&self, step: &numr::gpu::StepValues) -> Result<()> {
        if step.n_tok as usize > self.max_masks {
            return Err(bad("mask bits plan", format!("{} masks in a step (at most {})", step.n_tok, self.max_masks)));
        }
        Ok(())
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

/// The CPU reference of [`MaskBitsPlan`] on one row: every id whose bit is clear in `bits`
/// (ids past the mask's words included) gets `-f32::MAX`.
pub fn mask_bits_ref(logits: &mut [f32], bits: &[u32]) {
    for (id, l) in logits.iter_mut().enumerate() {
        if bits.get(id / 32).is_none_or(|w| w >> (id % 32) & 1 == 0) {
            *l = -f32::MAX;
        }
    }
}
