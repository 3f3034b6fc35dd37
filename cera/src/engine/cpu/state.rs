//! One sequence on the CPU: the KV cache, the activation slots, and a step running every op of
//! the graph in order.

use std::sync::Arc;

use boostr::act::{Act, GluInput};
use boostr::embedding::embedding_ref;
use boostr::kv_cache::KvDtype;
use boostr::norm::{Norm, NormKind};

use super::attention::{AttnShape, attention};
use super::matmul::linear;
use super::ops::{Heads, qkv_rope};
use super::{CpuOp, Model};
use crate::engine::EngineError;
use crate::engine::backend::{
    BackendState, CONV_RING, KvType, MAX_IN_FLIGHT, MAX_TOP_K, MAX_VERIFY_ROWS, RecurrentWindow, StateOpts, StepCounters, StepInput, StepOutput, Want,
};
use crate::engine::graph::Slot;

/// Every slot, in [`slot_index`] order.
pub(super) const SLOTS: [Slot; 11] =
    [Slot::Hidden, Slot::Normed, Slot::Qkv, Slot::Attn, Slot::Delta, Slot::DeltaNormed, Slot::GateUp, Slot::Glu, Slot::Logits, Slot::ConvIn, Slot::Conv];

/// The position of `s` in [`SLOTS`].
pub(super) fn slot_index(s: Slot) -> usize {
    match s {
        Slot::Hidden => 0,
        Slot::Normed => 1,
        Slot::Qkv => 2,
        Slot::Attn => 3,
        Slot::Delta => 4,
        Slot::DeltaNormed => 5,
        Slot::GateUp => 6,
        Slot::Glu => 7,
        Slot::Logits => 8,
        Slot::ConvIn => 9,
        Slot::Conv => 10,
    }
}

pub(super) fn ops_err(e: boostr::ops_common::OpsError) -> EngineError {
    EngineError::Device { device: "CPU".into(), reason: e.to_string() }
}

/// `n` zeros, or a typed error when the memory is not there.
pub(super) fn zeros(n: Option<usize>, what: &str) -> Result<Arc<Vec<f32>>, EngineError> {
    let oom = |n: Option<usize>| EngineError::Device {
        device: "CPU".into(),
        reason: format!("cannot allocate {what} ({} MiB)", n.map_or(u64::MAX, |n| (n as u64 * 4) >> 20)),
    };
    let n = n.ok_or_else(|| oom(None))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| oom(Some(n)))?;
    v.resize(n, 0.0);
    Ok(Arc::new(v))
}

/// A read-only slot and a different, writable one.
pub(super) fn io(slots: &mut [Arc<Vec<f32>>], x: Slot, out: Slot) -> (&[f32], &mut [f32]) {
    let (i, o) = (slot_index(x), slot_index(out));
    if i < o {
        let (a, b) = slots.split_at_mut(o);
        (&a[i][..], &mut Arc::make_mut(&mut b[0])[..])
    } else {
        let (a, b) = slots.split_at_mut(i);
        (&b[0][..], &mut Arc::make_mut(&mut a[o])[..])
    }
}

/// The NaN-safe ranking key of a logit.
fn key(v: f32) -> f32 {
    if v.is_nan() { f32::NEG_INFINITY } else { v }
}

/// The `k` largest logits with their ids, largest first, ties lower id first.
pub(super) fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in logits.iter().enumerate() {
        let kv = key(v);
        if best.len() == k && best.last().is_none_or(|&(_, b)| kv <= key(b)) {
            continue;
        }
        let at = best.partition_point(|&(_, b)| key(b) >= kv);
        best.insert(at, (i as u32, v));
        best.truncate(k);
    }
    best
}

/// A sequence's cache and activations.
pub(super) struct CpuState {
    model: Arc<Model>,
    opts: StateOpts,
    /// The cache's rounding (`None`: exact f32).
    kv: Option<KvDtype>,
    /// By [`slot_index`]: `ubatch` rows of the slot's width (logits: one row).
    slots: Vec<Arc<Vec<f32>>>,
    /// Per layer, `[kv_head][n_ctx][head_dim]`.
    keys: Vec<Arc<Vec<f32>>>,
    values: Vec<Arc<Vec<f32>>>,
    /// Per conv layer, the ring of `Bx` rows `[CONV_RING][dim]`.
    conv: Vec<Vec<f32>>,
    /// The recurrent window's bookkeeping (LFM2's conv rings).
    window: RecurrentWindow,
    /// Positions `0 .. len` hold valid K/V.
    len: usize,
    last_argmax: Option<u32>,
    /// Ids argmax never chooses (sorted).
    mask: Vec<u32>,
    /// The next output step's allowed-id mask (`set_step_bits`).
    bits: Option<Vec<u32>>,
    /// Outputs of submitted steps (run at submission), oldest first.
    done: std::collections::VecDeque<StepOutput>,
}

impl CpuState {
    pub(super) fn new(model: Arc<Model>, opts: &StateOpts) -> Result<CpuState, EngineError> {
        let c = &model.cfg;
        if opts.n_ctx == 0 || opts.ubatch == 0 || u32::try_from(opts.n_ctx).is_err() {
            return Err(EngineError::Usage(format!(
                "a state of {} positions and a ubatch of {} (both 1 or more, positions below 2^32)",
                opts.n_ctx, opts.ubatch
            )));
        }
        let kv = match opts.kv {
            KvType::F32 => None,
            KvType::F16 => Some(KvDtype::F16),
            KvType::Q8_0 if c.head_dim.is_multiple_of(32) => Some(KvDtype::Q8_0),
            KvType::Q8_0 => {
                return Err(EngineError::Unsupported { what: format!("a q8_0 KV cache for a head dimension of {} (not a multiple of 32)", c.head_dim) });
            }
        };
        let mut slots = Vec::with_capacity(SLOTS.len());
        for (&s, &w) in SLOTS.iter().zip(&model.widths) {
            let rows = if s == Slot::Logits { 1 } else { opts.ubatch };
            slots.push(zeros(rows.checked_mul(w), "activations")?);
        }
        let per_layer = c.n_kv_heads.checked_mul(opts.n_ctx).and_then(|x| x.checked_mul(c.head_dim));
        let mut keys = Vec::with_capacity(c.kv_layers());
        let mut values = Vec::with_capacity(c.kv_layers());
        for _ in 0..c.kv_layers() {
            keys.push(zeros(per_layer, "the KV cache")?);
            values.push(zeros(per_layer, "the KV cache")?);
        }
        let conv = (0..c.conv_layers()).map(|_| vec![0.0; CONV_RING * c.dim]).collect();
        let window = RecurrentWindow::new(c.conv_kernel);
        Ok(CpuState {
            model,
            opts: *opts,
            kv,
            slots,
            keys,
            values,
            conv,
            window,
            len: 0,
            last_argmax: None,
            mask: Vec::new(),
            bits: None,
            done: Default::default(),
        })
    }

    fn check(&self, ids: &[u32], pos: usize, want: Want) -> Result<(), EngineError> {
        let n = ids.len();
        if n == 0 {
            return Err(EngineError::Usage("a step of no tokens".into()));
        }
        if n > self.opts.ubatch {
            return Err(EngineError::Usage(format!("a step of {n} tokens, more than the ubatch of {}", self.opts.ubatch)));
        }
        if pos.checked_add(n).is_none_or(|e| e > self.opts.n_ctx) {
            return Err(EngineError::ContextOverflow { tokens: pos.saturating_add(n), n_ctx: self.opts.n_ctx });
        }
        if pos > self.len {
            return Err(EngineError::Usage(format!("a step at position {pos} with only {} positions cached", self.len)));
        }
        self.window.check(pos)?;
        let vocab = self.model.cfg.vocab;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        if let Want::TopK(k) = want
            && !(1..=MAX_TOP_K).contains(&k)
        {
            return Err(EngineError::Usage(format!("Want::TopK({k}) (1 to {MAX_TOP_K})")));
        }
        Ok(())
    }

    /// Runs `op` over the step's rows; the LM head over its last `logit_rows` rows (0: none).
    fn run(&mut self, op: &CpuOp, pool: &mut super::Pool, ids: &[u32], pos: usize, logit_rows: usize) -> Result<(), EngineError> {
        let m = &*self.model;
        if run_rowwise(m, &mut self.slots, pool, op, ids)? {
            return Ok(());
        }
        let c = &m.cfg;
        let (n, k) = (ids.len(), m.kernels);
        match op {
            CpuOp::QkvRope { layer, qk_norm, rope, freqs } => {
                let h = Heads { n_q: c.n_heads, n_kv: c.n_kv_heads, head_dim: c.head_dim, n_ctx: self.opts.n_ctx };
                let qkv = Arc::make_mut(&mut self.slots[slot_index(Slot::Qkv)]);
                let (kc, vc) = (Arc::make_mut(&mut self.keys[*layer]), Arc::make_mut(&mut self.values[*layer]));
                let norm = qk_norm.as_ref().map(|(q, k)| (&q[..], &k[..]));
                qkv_rope(h, qkv, n, pos, norm, c.norm_eps, rope, freqs, self.kv, kc, vc).map_err(ops_err)?;
            }
            CpuOp::Attention { layer, window } => {
                let s = AttnShape {
                    n_heads: c.n_heads,
                    n_kv: c.n_kv_heads,
                    head_dim: c.head_dim,
                    n_ctx: self.opts.n_ctx,
                    window: *window,
                    scale: c.attn_scale,
                    softcap: c.attn_softcap,
                };
                let qkv = self.slots[slot_index(Slot::Qkv)].clone();
                let o = Arc::make_mut(&mut self.slots[slot_index(Slot::Attn)]);
                attention(pool, k, s, &qkv, &self.keys[*layer], &self.values[*layer], pos, n, o)?;
            }
            CpuOp::ShortConv { state, conv, w } => {
                let d = c.dim;
                let bcx = self.slots[slot_index(Slot::ConvIn)].clone();
                let y = conv.reference(&bcx[..n * 3 * d], w, &mut self.conv[*state], pos, n, d).map_err(ops_err)?;
                Arc::make_mut(&mut self.slots[slot_index(Slot::Conv)])[..y.len()].copy_from_slice(&y);
            }
            CpuOp::LmHead { g, softcap } => {
                if logit_rows > 0 {
                    let xs = self.slots[slot_index(Slot::Normed)].clone();
                    let o = Arc::make_mut(&mut self.slots[slot_index(Slot::Logits)]);
                    if o.len() < logit_rows * c.vocab {
                        o.resize(logit_rows * c.vocab, 0.0); // once, at the first verification step
                    }
                    linear(pool, k, self.model.int8, g, &xs, n - logit_rows, logit_rows, o, c.vocab)?;
                    if let Some(cap) = softcap {
                        o[..logit_rows * c.vocab].iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
                    }
                }
            }
            _ => unreachable!("row-wise ops ran above"),
        }
        Ok(())
    }
}

/// Runs `op` over the `ids.len()` rows of `slots` when it treats each row on its own (the
/// embedding, norms, mat-muls, bias, GLU) and returns true; false for the ops that read a
/// sequence's cache or state (RoPE + KV write, attention, the short conv, the LM head).
pub(super) fn run_rowwise(m: &Model, slots: &mut [Arc<Vec<f32>>], pool: &mut super::Pool, op: &CpuOp, ids: &[u32]) -> Result<bool, EngineError> {
    let c = &m.cfg;
    let (n, k) = (ids.len(), m.kernels);
    let width = |s: Slot| m.widths[slot_index(s)];
    match op {
        CpuOp::Embed { table, scale } => {
            let e = embedding_ref(table, ids, *scale).map_err(ops_err)?;
            Arc::make_mut(&mut slots[slot_index(Slot::Hidden)])[..e.len()].copy_from_slice(&e);
        }
        CpuOp::Norm { x, w, out } => {
            let (xs, o) = io(slots, *x, *out);
            let y = Norm::rms().reference(&xs[..n * w.len()], w, None, None, w.len(), c.norm_eps).map_err(ops_err)?;
            o[..y.len()].copy_from_slice(&y);
        }
        CpuOp::AddNorm { x, w, out } => {
            let y = {
                let (xs, h) = io(slots, *x, Slot::Hidden);
                let add = Norm { kind: NormKind::Rms, weight_offset: false, bias: false, residual: true };
                add.reference(&xs[..n * c.dim], w, None, Some(&mut h[..n * c.dim]), c.dim, c.norm_eps).map_err(ops_err)?
            };
            Arc::make_mut(&mut slots[slot_index(*out)])[..y.len()].copy_from_slice(&y);
        }
        CpuOp::Linear { g, x, out } => {
            let xs = slots[slot_index(*x)].clone();
            let o = Arc::make_mut(&mut slots[slot_index(*out)]);
            linear(pool, k, m.int8, g, &xs, 0, n, o, width(*out))?;
        }
        CpuOp::Bias { x, b } => {
            let rows = &mut Arc::make_mut(&mut slots[slot_index(*x)])[..n * b.len()];
            boostr::bias::bias_reference(rows, b);
        }
        CpuOp::Glu { act, x, out } => {
            let f = width(*out);
            let (xs, o) = io(slots, *x, *out);
            let y = Act { kind: *act, input: GluInput::Packed }.reference(&xs[..n * 2 * f], None, n, f).map_err(ops_err)?;
            o[..y.len()].copy_from_slice(&y);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

impl CpuState {
    fn run_step(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<StepOutput, EngineError> {
        let last;
        let ids = match input {
            StepInput::Tokens(t) => t,
            StepInput::LastArgmax => {
                last = [self.last_argmax.ok_or_else(|| EngineError::Usage("StepInput::LastArgmax without a Want::Argmax step before it".into()))?];
                &last[..]
            }
        };
        let mut out = self.run_rows(ids, pos, want, 1)?;
        let out = out.pop().expect("one row");
        if let StepOutput::Argmax(id) = out {
            self.last_argmax = Some(id);
        }
        Ok(out)
    }

    /// Runs `ids` at `pos ..` and returns `want` after each of the last `rows` of them.
    fn run_rows(&mut self, ids: &[u32], pos: usize, want: Want, rows: usize) -> Result<Vec<StepOutput>, EngineError> {
        // A pending allowed-id mask belongs to this step, whatever becomes of it.
        let bits = self.bits.take();
        self.check(ids, pos, want)?;
        self.len = pos;
        self.last_argmax = None;
        let model = self.model.clone();
        {
            let mut pool = model.pool.lock().unwrap_or_else(|e| e.into_inner());
            for op in &model.ops {
                self.run(op, &mut pool, ids, pos, if want == Want::Nothing { 0 } else { rows })?;
            }
        }
        self.len = pos + ids.len();
        self.window.ran(pos, ids.len());
        let vocab = model.cfg.vocab;
        if want != Want::Nothing
            && let Some(bits) = bits
        {
            let all = std::sync::Arc::make_mut(&mut self.slots[slot_index(Slot::Logits)]);
            for r in 0..rows {
                boostr::sampling::mask_bits_ref(&mut all[r * vocab..(r + 1) * vocab], &bits);
            }
        }
        let all = &self.slots[slot_index(Slot::Logits)];
        Ok((0..rows)
            .map(|r| {
                let logits = &all[r * vocab..(r + 1) * vocab];
                match want {
                    Want::Nothing => StepOutput::Nothing,
                    Want::Argmax => {
                        let mask = &self.mask;
                        StepOutput::Argmax(top_k(logits, 1 + mask.len()).into_iter().map(|c| c.0).find(|id| mask.binary_search(id).is_err()).unwrap_or(0))
                    }
                    Want::TopK(k) => StepOutput::TopK(top_k(logits, k)),
                    Want::Logits => StepOutput::Logits(logits.to_vec()),
                }
            })
            .collect())
    }
}

impl BackendState for CpuState {
    fn submit(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(), EngineError> {
        if self.done.len() >= MAX_IN_FLIGHT {
            return Err(EngineError::Usage(format!("a step submitted with {MAX_IN_FLIGHT} outstanding (collect one first)")));
        }
        let out = self.run_step(input, pos, want)?;
        self.done.push_back(out);
        Ok(())
    }

    fn collect(&mut self) -> Result<StepOutput, EngineError> {
        self.done.pop_front().ok_or_else(|| EngineError::Usage("collecting a step that was not submitted".into()))
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn applies_step_bits(&self) -> bool {
        true
    }

    fn set_step_bits(&mut self, bits: &[u32]) -> Result<(), EngineError> {
        super::super::backend::check_mask_words(self.model.cfg.vocab, bits)?;
        self.bits = Some(bits.to_vec());
        Ok(())
    }

    fn set_argmax_mask(&mut self, ids: &[u32]) -> Result<(), EngineError> {
        self.mask = ids.to_vec();
        self.mask.sort_unstable();
        self.mask.dedup();
        Ok(())
    }

    fn resume_floor(&self) -> usize {
        self.window.floor()
    }

    fn verify(&mut self, tokens: &[u32], pos: usize, want: Want) -> Result<Vec<StepOutput>, EngineError> {
        if !self.done.is_empty() {
            return Err(EngineError::Usage(format!("a verification step with {} steps not collected", self.done.len())));
        }
        if tokens.len() > MAX_VERIFY_ROWS {
            return Err(EngineError::Usage(format!("a verification step of {} tokens (at most {MAX_VERIFY_ROWS})", tokens.len())));
        }
        self.run_rows(tokens, pos, want, tokens.len())
    }

    fn reset(&mut self) -> Result<(), EngineError> {
        self.done.clear();
        self.last_argmax = None;
        Ok(())
    }

    /// The CPU dispatches nothing: all zeros.
    fn last_step_counters(&self) -> StepCounters {
        StepCounters::default()
    }
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_is_sorted_with_ties_to_the_lower_id() {
        let l = [1.0, 3.0, f32::NAN, 3.0, -1.0, 2.0, 3.0];
        assert_eq!(top_k(&l, 4), vec![(1, 3.0), (3, 3.0), (6, 3.0), (5, 2.0)]);
        assert_eq!(top_k(&l, 1), vec![(1, 3.0)]);
        assert_eq!(top_k(&l[..2], 5).len(), 2);
    }
}
