//! A sequence's speculative verification step on the GPU ([`BackendState::verify`]): the last
//! accepted token and up to [`MAX_DRAFT`](super::super::super::batch::MAX_DRAFT) drafts run as
//! one recording and one submit, with an output at every row.
//!
//! The plan is the prefill plan over [`MAX_VERIFY_ROWS`] rows (RoPE and the KV write at each
//! row's position, causal attention over the contiguous cache) except that every projection
//! and the LM head take all rows through the multi-row GEMV of batched decoding, which reads
//! the weights once for the step: verifying `k` drafts costs about one decode step's weight
//! reads, not `k + 1`. Then argmax (with the `ignore_eos` mask on every row) or top-k over the
//! rows, and one readback. Its first dispatches are submitted early (the prefill chunk's
//! `prefill_lead`), so the GPU starts while the host encodes the rest. It is built at the first verification step, so sessions that never
//! speculate pay nothing for it.
//!
//! [`BackendState::verify`]: super::super::super::backend::BackendState::verify

use boostr::ops_common::{GpuView, OpPlan};
use boostr::sampling::{ArgmaxPlan, MaskPlan, TopKPlan};
use numr::gpu::{Binding, Plan, StepValues};

use super::super::super::EngineError;
use super::super::super::backend::{KernelTime, MAX_TOP_K, MAX_VERIFY_ROWS, StepOutput, Want};
use super::super::super::graph::Slot;
use super::super::lead::record_with_lead;
use super::super::ops_err;
use super::super::plans::{Mode, PlanInputs, Slots, build};
use super::{GpuState, word};

/// The verification plan and what reads its rows, made once.
pub(super) struct VerifyPlans {
    rows: usize,
    slots: Slots,
    plan: Plan,
    argmax: ArgmaxPlan,
    topk: TopKPlan,
    /// The argmax mask's ids and one mask plan per row.
    mask: Option<(Vec<u32>, Vec<MaskPlan>)>,
}

impl GpuState {
    /// The verification plan's activation buffers (`None` before it is built).
    pub(super) fn verify_slots(&self) -> Option<&Slots> {
        self.verify.as_ref().map(|v| &v.slots)
    }

    pub(super) fn build_verify(&self) -> Result<VerifyPlans, EngineError> {
        let (ctx, g) = (&*self.ctx, &*self.graph);
        let inp = PlanInputs {
            graph: g,
            weights: &self._weights,
            cache: Some(&self._cache),
            paged: None,
            paged_ctx: 0,
            ids: &self.ids,
            freqs: &self.freqs,
            conv: &self._conv,
            conv_seqs: None,
            decode_gemv: self.decode_gemv,
            tuning: &self.tuning,
            batch_decode_gemv: false,
            prefill_gemv: true,
            rows_only: false,
        };
        let rows = MAX_VERIFY_ROWS.min(self.ubatch);
        let slots = Slots::with_logit_rows(ctx, g, rows, 1, rows)?;
        let plan = build(ctx, &inp, &slots, Mode::Prefill { max_tok: rows })?;
        let vocab = g.cfg.vocab;
        let argmax = ArgmaxPlan::rows(ctx, &slots.view(Slot::Logits), vocab, rows, None).map_err(ops_err)?;
        let topk = TopKPlan::rows(ctx, &slots.view(Slot::Logits), vocab, MAX_TOP_K.min(vocab), rows).map_err(ops_err)?;
        Ok(VerifyPlans { rows, slots, plan, argmax, topk, mask: None })
    }

    /// [`BackendState::verify`](super::super::super::backend::BackendState::verify).
    pub(super) fn verify_step(&mut self, tokens: &[u32], pos: usize, want: Want) -> Result<Vec<StepOutput>, EngineError> {
        Ok(self.verify_inner(tokens, pos, want, false)?.0)
    }

    /// [`BackendState::profile_verify`](super::super::super::backend::BackendState::profile_verify):
    /// the step in one submit with timestamps around every dispatch.
    pub(super) fn profile_verify_step(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<KernelTime>, EngineError> {
        Ok(self.verify_inner(tokens, pos, Want::Argmax, true)?.1.unwrap_or_default())
    }

    /// A verification step; `profile`: one submit (no early parts) with device timestamps, whose
    /// GPU time per kernel label comes back too.
    fn verify_inner(&mut self, tokens: &[u32], pos: usize, want: Want, profile: bool) -> Result<(Vec<StepOutput>, Option<Vec<KernelTime>>), EngineError> {
        let (n, vocab) = (tokens.len(), self.graph.cfg.vocab);
        if !self.pending.is_empty() {
            return Err(EngineError::Usage(format!("a verification step with {} steps not collected", self.pending.len())));
        }
        let max = MAX_VERIFY_ROWS.min(self.ubatch);
        if n == 0 || n > max {
            return Err(EngineError::Usage(format!("a verification step of {n} tokens (1 ..= {max})")));
        }
        if pos + n > self.n_ctx {
            return Err(EngineError::ContextOverflow { tokens: pos + n, n_ctx: self.n_ctx });
        }
        self.window.check(pos)?;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        if let Want::TopK(k) = want
            && (k == 0 || k > MAX_TOP_K.min(vocab))
        {
            return Err(EngineError::Usage(format!("top-{k} candidates (1 ..= {})", MAX_TOP_K.min(vocab))));
        }
        if self.verify.is_none() {
            self.verify = Some(self.build_verify()?);
        }
        // The argmax mask on every row, rebuilt when it changed.
        let wanted: &[u32] = self.mask.as_ref().map_or(&[], |m| m.0.as_slice());
        let v = self.verify.as_mut().expect("built above");
        if v.mask.as_ref().map_or(&[][..], |m| m.0.as_slice()) != wanted {
            v.mask = match &self.mask {
                None => None,
                Some((ids, buf, _)) => {
                    let logits = v.slots.buf(Slot::Logits);
                    let plans = (0..v.rows)
                        .map(|r| MaskPlan::new(&self.ctx, &GpuView::new(Binding::whole(logits), r * vocab), vocab, &GpuView::whole(buf), ids.len()))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(ops_err)?;
                    Some((ids.clone(), plans))
                }
            };
        }
        let err = |e: numr::NumrError| EngineError::Device { device: self.device.clone(), reason: e.to_string() };
        self.ctx.write(&self.ids, 0, bytemuck::cast_slice(tokens)).map_err(err)?;
        self.has_last = false;
        self.window.ran(pos, n);
        let start = std::time::Instant::now();
        // The state's recorder (kept, so that a step allocates nothing); on an error the
        // half-recorded step is dropped with it and the next step makes another.
        let mut rec = if profile { self.ctx.recorder() } else { self.rec.take().unwrap_or_else(|| self.ctx.recorder()) };
        let lead = if profile { 0 } else { self.prefill_lead };
        let chunk = StepValues::chunk(word("position", pos)?, word("tokens", n)?).with_token(0).with_decode_rows(n as u32);
        // The plan's first dispatches go out while the host encodes the rest: the host waits for
        // this step, so its encoding would otherwise add to the GPU's time.
        let early = record_with_lead(&mut rec, v.plan.dispatches(), &chunk, lead).map_err(err)?;
        let rows = StepValues::chunk(0, n as u32).with_decode_rows(n as u32);
        let kk = v.topk.k() as u64;
        let reads = match want {
            Want::Nothing => None,
            Want::Argmax => {
                if let Some((_, plans)) = &v.mask {
                    for p in &plans[..n] {
                        p.record(&mut rec, &rows).map_err(ops_err)?;
                    }
                }
                v.argmax.record(&mut rec, &rows).map_err(ops_err)?;
                let ids = v.argmax.ids();
                Some((rec.read(ids.buffer(), ids.byte_offset(), 4 * n as u64).map_err(err)?, None))
            }
            Want::TopK(_) => {
                v.topk.record(&mut rec, &rows).map_err(ops_err)?;
                let (i, vals) = (v.topk.ids(), v.topk.values());
                Some((
                    rec.read(i.buffer(), i.byte_offset(), 4 * kk * n as u64).map_err(err)?,
                    Some(rec.read(vals.buffer(), vals.byte_offset(), 4 * kk * n as u64).map_err(err)?),
                ))
            }
            Want::Logits => Some((rec.read(v.slots.buf(Slot::Logits), 0, 4 * (n * vocab) as u64).map_err(err)?, None)),
        };
        let (dispatches, passes) = (early.dispatches + rec.dispatch_count(), early.passes + rec.pass_count());
        let mut times = None;
        if profile {
            let p = rec.submit_profiled().map_err(err)?;
            times = Some(p.by_label().into_iter().map(|(label, (ns, count))| KernelTime { label, ns, count }).collect());
        } else {
            let submitted = rec.submit_and_clear();
            self.rec = Some(rec);
            submitted.map_err(err)?;
        }
        self.counters =
            super::super::super::backend::StepCounters { dispatches, passes, submits: early.submits + 1, host_ns: start.elapsed().as_nanos() as u64 };
        let Some((first, second)) = reads else { return Ok((vec![StepOutput::Nothing; n], times)) };
        let out = match want {
            Want::Argmax => first.wait_u32().map_err(err)?.into_iter().map(StepOutput::Argmax).collect(),
            Want::TopK(k) => {
                let ids = first.wait_u32().map_err(err)?;
                let vals = second.expect("top-k values").wait().map_err(err)?;
                let vals: &[f32] = bytemuck::cast_slice(&vals);
                let kk = kk as usize;
                (0..n).map(|r| StepOutput::TopK((r * kk..r * kk + k.min(kk)).map(|i| (ids[i], vals[i])).collect())).collect()
            }
            Want::Logits => {
                let all = first.wait().map_err(err)?;
                let all: &[f32] = bytemuck::cast_slice(&all);
                all.chunks(vocab).map(|row| StepOutput::Logits(row.to_vec())).collect()
            }
            Want::Nothing => unreachable!("returned above"),
        };
        Ok((out, times))
    }
}
