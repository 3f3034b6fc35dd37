//! llama.cpp's penalties over a window of a GPU id history, in place on the logits:
//!
//! for each unique id among the window's ids, with `count` its occurrences in the window:
//! `logit = logit > 0 ? logit / repetition : logit * repetition;`
//! `logit -= count * frequency + presence` (`count > 0` by construction).
//!
//! Each id is handled once, by the invocation of its first occurrence in the window, which also
//! counts the later occurrences: no atomics, every logit written by at most one invocation,
//! deterministic. The window is O(window²) compares (window 64: 4096), nothing next to a GEMV.

use crate::ops_common::OpPlan;
use numr::Tensor;
use numr::gpu::{Access, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, StepValues};

use crate::ops_common::{GpuView, OpsError, Result, bad, env_of, step_grid, tensor_view, to_u32, upload_u32};

/// The penalty values (llama.cpp's `penalty_repeat`, `penalty_freq`, `penalty_present`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// Positive logits divided by it, others multiplied (1: off).
    pub repetition: f32,
    /// Subtracted once per occurrence (0: off).
    pub frequency: f32,
    /// Subtracted once per id present (0: off).
    pub presence: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties { repetition: 1.0, frequency: 0.0, presence: 0.0 }
    }
}

impl Penalties {
    /// Only the repetition penalty.
    pub fn repetition(penalty: f32) -> Penalties {
        Penalties { repetition: penalty, ..Penalties::default() }
    }

    /// Whether applying them changes nothing.
    pub fn is_none(&self) -> bool {
        *self == Penalties::default()
    }

    fn check(&self, op: &'static str) -> Result<()> {
        if !(self.repetition > 0.0 && self.repetition.is_finite() && self.frequency.is_finite() && self.presence.is_finite()) {
            return Err(bad(
                op,
                format!("repetition {}, frequency {}, presence {} (repetition must be positive, all finite)", self.repetition, self.frequency, self.presence),
            ));
        }
        Ok(())
    }
}

/// The penalty kernel (in place on the logits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Penalty;

impl Penalty {
    /// WGSL. Bindings `logits` (rw), `ids`; params `n, l_off, h_off, start, len, repetition,
    /// frequency, presence`.
    ///
    /// Bounds: invocation `i < len` reads `ids[h_off + start + j]` for `j < len` and, when the id
    /// is below `n`, reads and writes `logits[l_off + id]`; [`PenaltyPlan::new`] checks the
    /// logits view holds `n` and the history view each step's window.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("penalties", *env)
            .workgroup(256, 1, 1)
            .storage("logits", Access::ReadWrite, "array<f32>")
            .storage("ids", Access::Read, "array<u32>")
            .params(&["n", "l_off", "h_off", "start", "len", "repetition", "frequency", "presence"])
            .body(
                "    let i = wg_linear * 256u + lidx;
    if (i >= p.len) { return; }
    let base = p.h_off + p.start;
    let id = ids[base + i];
    if (id >= p.n) { return; }
    for (var j = 0u; j < i; j++) { if (ids[base + j] == id) { return; } }
    var count = 1u;
    for (var j = i + 1u; j < p.len; j++) { if (ids[base + j] == id) { count += 1u; } }
    let rep = bitcast<f32>(p.repetition);
    let v = logits[p.l_off + id];
    let r = select(v * rep, v / rep, v > 0.0);
    logits[p.l_off + id] = r - (f32(count) * bitcast<f32>(p.frequency) + bitcast<f32>(p.presence));
",
            )
            .build()
    }
}

/// The penalties over the last `window` ids of `history[0 .. step.kv_len()]` (the engine writes
/// each position's token id at its index), applied in place to `n` logits. Ids at or past `n`
/// are skipped. One dispatch.
#[derive(Clone, Debug)]
pub struct PenaltyPlan {
    plan: Plan,
    history_len: usize,
    penalties: Penalties,
}

impl PenaltyPlan {
    /// Builds the plan: `logits` (`n` f32, updated in place), `history` (u32 ids), `window`
    /// (e.g. 64, llama.cpp's `penalty_last_n`) fixed here.
    pub fn new(ctx: &GpuContext, logits: &GpuView, n: usize, history: &GpuView, window: usize, penalties: Penalties) -> Result<PenaltyPlan> {
        const OP: &str = "penalty plan";
        penalties.check(OP)?;
        if n == 0 || window == 0 || history.words() == 0 {
            return Err(bad(OP, format!("{n} logits, a window of {window}, a history of {} ids (all must be positive)", history.words())));
        }
        logits.need(OP, "the logits", n)?;
        history.need(OP, "the history", history.words())?;
        let (w32, h_off) = (to_u32(OP, "window", window)?, history.offset_u32(OP)?);
        let kernel = ctx.kernel(&Penalty.source(&env_of(ctx)))?;
        let group = ctx.bind(&kernel, &[logits.binding.clone(), history.binding.clone()])?;
        let hist = to_u32(OP, "history", history.words())?;
        // The window [kv_len - len, kv_len) with kv_len clamped to the history.
        let len = move |s: &StepValues| s.kv_len().min(hist).min(w32);
        let grid = step_grid(ctx, window as u64, 256, move |s| len(s) as u64)?;
        let d = PlanDispatch::new(&kernel, group, [1, 1, 1])?
            .set_usize("n", n)?
            .set("l_off", logits.offset_u32(OP)?)?
            .set("h_off", h_off)?
            .set_f32("repetition", penalties.repetition)?
            .set_f32("frequency", penalties.frequency)?
            .set_f32("presence", penalties.presence)?
            .per_step("start", move |s| s.kv_len().min(hist) - len(s))?
            .per_step("len", len)?
            .grid_per_step(grid);
        Ok(PenaltyPlan { plan: Plan::from(d), history_len: history.words(), penalties })
    }

    /// The same plan (bind group, buffers) with other values: creates nothing on the GPU.
    pub fn with_penalties(&self, penalties: Penalties) -> Result<PenaltyPlan> {
        penalties.check("penalty plan")?;
        let d = self.plan.dispatches()[0]
            .clone()
            .set_f32("repetition", penalties.repetition)?
            .set_f32("frequency", penalties.frequency)?
            .set_f32("presence", penalties.presence)?;
        Ok(PenaltyPlan { plan: Plan::from(d), history_len: self.history_len, penalties })
    }

    /// The penalty values the plan applies.
    pub fn penalties(&self) -> Penalties {
        self.penalties
    }
}

impl OpPlan for PenaltyPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        if step.kv_len() as usize > self.history_len {
            return Err(OpsError::ContextOverflow { needed: step.kv_len() as usize, capacity: self.history_len });
        }
        Ok(())
    }

    /// The underlying plan (recorded directly, the window is clamped to the history buffer).
    fn plan(&self) -> &Plan {
        &self.plan
    }
}

/// Applies the penalties in place to `logits` (contiguous f32 on the GPU) over the last `window`
/// ids of `history` (each checked against the vocabulary: [`OpsError::TokenOutOfRange`]).
pub fn penalties(ctx: &GpuContext, logits: &Tensor, history: &[u32], window: usize, p: &Penalties) -> Result<()> {
    let lv = tensor_view("penalties", "the logits", logits, numr::DType::F32)?;
    let n = logits.numel();
    if let Some(&id) = history.iter().find(|&&id| id as usize >= n) {
        return Err(OpsError::TokenOutOfRange { id, vocab: n });
    }
    p.check("penalties")?;
    if history.is_empty() || window == 0 || p.is_none() {
        return Ok(());
    }
    let hv = GpuView::whole(&upload_u32(ctx, history)?);
    let plan = PenaltyPlan::new(ctx, &lv, n, &hv, window, *p)?;
    plan.run(ctx, &StepValues::chunk(0, to_u32("penalties", "history", history.len())?))
}

/// Applies the repetition penalty in place to the logits of `ids` (each id once; each checked
/// against the vocabulary).
pub fn repetition_penalty(ctx: &GpuContext, logits: &Tensor, ids: &[u32], penalty: f32) -> Result<()> {
    penalties(ctx, logits, ids, ids.len(), &Penalties::repetition(penalty))
}

/// CPU reference of [`PenaltyPlan`]: the penalties over the last `window` ids of `history`
/// (= `ids[0 .. kv_len]`), in place; ids at or past `logits.len()` are skipped, as on the GPU.
pub fn penalties_ref(logits: &mut [f32], history: &[u32], window: usize, p: &Penalties) -> Result<()> {
    p.check("penalties reference")?;
    let win = &history[history.len() - window.min(history.len())..];
    for (i, &id) in win.iter().enumerate() {
        if id as usize >= logits.len() || win[..i].contains(&id) {
            continue;
        }
        let count = win[i..].iter().filter(|&&x| x == id).count();
        let v = logits[id as usize];
        let r = if v > 0.0 { v / p.repetition } else { v * p.repetition };
        logits[id as usize] = r - (count as f32 * p.frequency + p.presence);
    }
    Ok(())
}

/// CPU reference of [`repetition_penalty`] (llama.cpp semantics), in place. An id past the
/// logits is [`OpsError::TokenOutOfRange`].
pub fn repetition_penalty_ref(logits: &mut [f32], ids: &[u32], penalty: f32) -> Result<()> {
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= logits.len()) {
        return Err(OpsError::TokenOutOfRange { id, vocab: logits.len() });
    }
    penalties_ref(logits, ids, ids.len(), &Penalties::repetition(penalty))
}
