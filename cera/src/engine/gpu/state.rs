//! One sequence on the GPU: its KV cache, activation buffers, the decode and prefill plans built
//! over them, the sampling plans, and the id buffer `[ubatch prompt slots | argmax slot]`.
//!
//! A decode step is ONE recording and ONE submit. A step of one token runs the decode plan; a
//! chunk of several runs the prefill plan over all its tokens and, when the step wants a
//! distribution, copies the chunk's last normalised row into the decode slots and runs the
//! head plan (the LM head's GEMV alone) on it. A chunk's prefill plan (hundreds of dispatches)
//! goes out in submits of doubling size ([`GpuTuning::prefill_lead`](super::super::tuning::GpuTuning::prefill_lead)
//! dispatches first), so the GPU starts
//! on the first layers while the host encodes the rest. Then argmax / top-k / nothing, and one readback
//! of what the sampler needs (4 bytes for greedy).
//! Greedy decoding leaves the id in the argmax slot, where the next step's embedding reads it,
//! so the next step can be recorded and submitted before this one's id is read back (up to
//! `MAX_IN_FLIGHT` steps outstanding, their readbacks queued in order).

use std::collections::VecDeque;
use std::sync::Arc;

use boostr::kv_cache::{KvCache, KvCacheConfig};
use boostr::ops_common::{GpuView, OpPlan};
use boostr::sampling::{ArgmaxPlan, MaskBitsPlan, MaskPlan, TopKPlan};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, PendingRead, Plan, ReadTarget, Recorder, StepValues};

use super::super::EngineError;
use super::super::backend::{
    BackendState, CONV_RING, KernelTime, MAX_IN_FLIGHT, MAX_TOP_K, RecurrentWindow, StateOpts, StepCounters, StepInput, StepOutput, Want,
};
use super::super::graph::{ModelGraph, Slot};
use super::super::options::DecodeGemv;
use super::super::tuning::GpuTuning;
use super::lead::record_with_lead;
use super::plans::{Mode, PlanInputs, Slots, build, build_layers, inv_freqs, kv_dtype, prefill_qkv_splits};
use super::trace::StepTrace;
use super::weights::GpuWeights;
use super::{GpuBackend, dev_err, ops_err};

#[path = "verify.rs"]
mod verify;

pub(crate) struct GpuState {
    ctx: Arc<GpuContext>,
    graph: Arc<ModelGraph>,
    device: String,
    _weights: Arc<GpuWeights>,
    _cache: KvCache,
    /// LFM2's conv rings (the plans bind them).
    _conv: Vec<Arc<GpuBuffer>>,
    /// Which positions the conv rings let a step start at.
    window: RecurrentWindow,
    ids: Arc<GpuBuffer>,
    n_ctx: usize,
    ubatch: usize,
    /// Dispatches of a prefill chunk's first early submit (`GpuTuning::prefill_lead`).
    prefill_lead: usize,
    decode: Plan,
    prefill: Plan,
    /// The LM head over the decode slots' `Normed` row (a prefill chunk's logits).
    head: Plan,
    dec_slots: Slots,
    pre_slots: Slots,
    argmax: ArgmaxPlan,
    topk: TopKPlan,
    /// The ids argmax never chooses, the buffer holding them and the plan masking them.
    mask: Option<(Vec<u32>, Arc<GpuBuffer>, MaskPlan)>,
    /// A constraint's allowed-id mask for the next output step (`set_step_bits`): its buffer,
    /// the plan applying it to the decode slots' logits row, and whether it is pending.
    bits: (Arc<GpuBuffer>, MaskBitsPlan, bool),
    /// An argmax step was submitted last: its id is in the argmax slot.
    has_last: bool,
    /// Submitted steps' readbacks, oldest first.
    pending: VecDeque<Reads>,
    /// The recorder every step records into (kept, so that a step allocates nothing).
    rec: Option<Recorder>,
    /// Where argmax ids are read back to: one per step in flight, made once.
    argmax_reads: Vec<ReadTarget>,
    counters: StepCounters,
    trace: StepTrace,
    /// Per layer, the inverse RoPE frequencies (the verification plan binds them too).
    freqs: Vec<Arc<GpuBuffer>>,
    tuning: GpuTuning,
    decode_gemv: DecodeGemv,
    /// The speculative verification step's plans, made at its first use.
    verify: Option<verify::VerifyPlans>,
}

/// A recorded step's token ids: written with the recording, or `Later(n)`: `n` ids that
/// [`GpuState::submit_deferred`] writes just before the submit.
#[derive(Clone, Copy)]
enum StepIds<'a> {
    Now(StepInput<'a>),
    Later(usize),
}

fn word(what: &str, v: usize) -> Result<u32, EngineError> {
    u32::try_from(v).map_err(|_| EngineError::Usage(format!("{what} {v} does not fit 32 bits")))
}

impl GpuState {
    pub(crate) fn new(b: &GpuBackend, opts: &StateOpts) -> Result<GpuState, EngineError> {
        let (ctx, g) = (&b.ctx, &b.graph);
        let c = &g.cfg;
        if opts.n_ctx == 0 || opts.ubatch == 0 {
            return Err(EngineError::Usage(format!("a context of {} and a ubatch of {}", opts.n_ctx, opts.ubatch)));
        }
        let ubatch = opts.ubatch.min(opts.n_ctx);
        let cache_cfg = KvCacheConfig {
            n_layers: c.kv_layers().max(1),
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            capacity: opts.n_ctx,
            dtype: kv_dtype(opts.kv)?,
            max_segment_bytes: None,
        };
        let cache = KvCache::new(ctx, cache_cfg).map_err(ops_err)?;
        let ids = ctx.alloc(4 * (ubatch as u64 + 1), BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        ctx.write(&ids, 0, &vec![0u8; 4 * (ubatch + 1)]).map_err(|e| dev_err(ctx, e))?;
        let mut freqs = vec![None; c.n_layers];
        for op in &g.ops {
            if let super::super::graph::Op::QkvRope { layer, .. } = op {
                let f = inv_freqs(g, &b.weights, op)?;
                freqs[*layer] = Some(ctx.upload(bytemuck::cast_slice(&f)).map_err(|e| dev_err(ctx, e))?);
            }
        }
        let dummy = ctx.alloc(16, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        let freqs: Vec<Arc<GpuBuffer>> = freqs.into_iter().map(|f| f.unwrap_or_else(|| dummy.clone())).collect();
        let mut conv = Vec::with_capacity(c.conv_layers());
        for _ in 0..c.conv_layers() {
            let ring = ctx.alloc(4 * (CONV_RING * c.dim) as u64, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
            ctx.write(&ring, 0, &vec![0u8; 4 * CONV_RING * c.dim]).map_err(|e| dev_err(ctx, e))?;
            conv.push(ring);
        }
        let inp = PlanInputs {
            graph: g,
            weights: &b.weights,
            cache: Some(&cache),
            paged: None,
            paged_ctx: 0,
            ids: &ids,
            freqs: &freqs,
            conv: &conv,
            conv_seqs: None,
            decode_gemv: b.decode_gemv,
            tuning: &b.tuning,
            batch_decode_gemv: false,
            prefill_gemv: false,
            rows_only: false,
        };
        let dec_slots = Slots::new(ctx, g, 1, 1)?;
        let pre_slots = Slots::new(ctx, g, ubatch, prefill_qkv_splits(ctx, &inp, ubatch))?;
        let (decode, layer_starts) = build_layers(ctx, &inp, &dec_slots, Mode::Decode)?;
        let diag = &b.diagnostics;
        let decode = super::ablate::ablated(super::chains::chained(ctx, decode, &layer_starts, &b.tuning, diag.chain_verbose), &diag.ablate);
        let prefill = build(ctx, &inp, &pre_slots, Mode::Prefill { max_tok: ubatch })?;
        let head = build(ctx, &inp, &dec_slots, Mode::Head)?;
        let logits = GpuView::whole(dec_slots.buf(Slot::Logits));
        let argmax = ArgmaxPlan::new(ctx, &logits, c.vocab, Some(GpuView::new(Binding::whole(&ids), ubatch)), 1).map_err(ops_err)?;
        let topk = TopKPlan::new(ctx, &logits, c.vocab, MAX_TOP_K.min(c.vocab), 1.0, 1, None).map_err(ops_err)?;
        // The readback buffers of every kind of step, for as many steps as can be in flight,
        // made now so that no step allocates.
        let mut reads = Vec::new();
        for _ in 0..MAX_IN_FLIGHT {
            let mut rec = ctx.recorder();
            let (iv, vv) = (topk.ids().clone(), topk.values().clone());
            reads.extend([
                rec.read(&ids, 0, 4),
                rec.read(dec_slots.buf(Slot::Logits), 0, 4 * c.vocab as u64),
                rec.read(iv.buffer(), iv.byte_offset(), 4 * topk.k() as u64),
                rec.read(vv.buffer(), vv.byte_offset(), 4 * topk.k() as u64),
            ]);
            rec.submit().map_err(|e| dev_err(ctx, e))?;
        }
        for r in reads {
            r.map_err(|e| dev_err(ctx, e))?.wait().map_err(|e| dev_err(ctx, e))?;
        }
        let argmax_reads = (0..MAX_IN_FLIGHT).map(|_| ctx.read_target(4)).collect::<Result<Vec<_>, _>>().map_err(|e| dev_err(ctx, e))?;
        let bits_buf = ctx.alloc(4 * c.vocab.div_ceil(32) as u64, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        let bits_row = ctx.upload(bytemuck::cast_slice(&[0u32])).map_err(|e| dev_err(ctx, e))?;
        let bits_plan =
            MaskBitsPlan::new(ctx, &dec_slots.view(Slot::Logits), c.vocab, 1, &GpuView::whole(&bits_buf), &GpuView::whole(&bits_row), 1).map_err(ops_err)?;
        Ok(GpuState {
            ctx: ctx.clone(),
            graph: g.clone(),
            device: b.device.clone(),
            _weights: b.weights.clone(),
            _cache: cache,
            _conv: conv,
            window: RecurrentWindow::new(c.conv_kernel),
            ids,
            n_ctx: opts.n_ctx,
            ubatch,
            prefill_lead: b.tuning.prefill_lead,
            decode,
            prefill,
            head,
            dec_slots,
            pre_slots,
            argmax,
            topk,
            mask: None,
            bits: (bits_buf, bits_plan, false),
            has_last: false,
            pending: VecDeque::with_capacity(MAX_IN_FLIGHT),
            rec: Some(ctx.recorder()),
            argmax_reads,
            counters: StepCounters::default(),
            trace: StepTrace::new(ctx, b.diagnostics.step_trace),
            freqs,
            tuning: b.tuning.clone(),
            decode_gemv: b.decode_gemv,
            verify: None,
        })
    }

    pub(super) fn err(&self, e: numr::NumrError) -> EngineError {
        EngineError::Device { device: self.device.clone(), reason: e.to_string() }
    }

    /// The activation buffers a step of `n` tokens runs through (the decode plan's for one).
    fn step_slots(&self, n: usize) -> &Slots {
        if n == 1 { &self.dec_slots } else { &self.pre_slots }
    }

    /// The buffers of a step of `n` tokens, or of the verification step (`verify`: built by
    /// [`BackendState::prepare_verify`] first), with a check of `n`.
    fn io_slots(&self, n: usize, verify: bool) -> Result<&Slots, EngineError> {
        let max = if verify { super::super::backend::MAX_VERIFY_ROWS.min(self.ubatch) } else { self.ubatch };
        if n == 0 || n > max {
            return Err(EngineError::Usage(format!("{n} rows of a step (1 ..= {max})")));
        }
        if verify {
            return self.verify_slots().ok_or_else(|| EngineError::Usage("rows of a verification step before its plan is built".into()));
        }
        Ok(self.step_slots(n))
    }

    /// Writes `rows` (`n` rows of the slot's width, f32) into `slot` for the next step of `n`
    /// tokens (`verify`: the next verification step): a stage of a split model receiving what
    /// the previous stage handed on.
    pub(super) fn write_rows(&self, slot: Slot, n: usize, rows: &[f32], verify: bool) -> Result<(), EngineError> {
        let want = n * self.graph.width(slot);
        if rows.len() != want {
            return Err(EngineError::Usage(format!("{} values for {n} rows of {slot:?} ({want})", rows.len())));
        }
        self.ctx.write(self.io_slots(n, verify)?.buf(slot), 0, bytemuck::cast_slice(rows)).map_err(|e| self.err(e))
    }

    /// Records a step of `n` tokens at `pos` (their ids are written by [`Self::submit_deferred`])
    /// and, after it, reads of the first `n` rows of `out` (the slots the next device of a split
    /// model needs), without submitting. No part of it goes out early, so rows written into
    /// this device's slots before [`Self::submit_deferred`] reach every dispatch.
    pub(super) fn record_deferred(&mut self, n: usize, pos: usize, want: Want, out: &[Slot]) -> Result<Deferred, EngineError> {
        if self.pending.len() >= MAX_IN_FLIGHT {
            return Err(EngineError::Usage(format!("a step submitted with {MAX_IN_FLIGHT} outstanding (collect one first)")));
        }
        let mut rec = self.rec.take().unwrap_or_else(|| self.ctx.recorder());
        let reads = self.record(&mut rec, StepIds::Later(n), pos, want, &mut None)?;
        let rows = out
            .iter()
            .map(|&s| rec.read(self.step_slots(n).buf(s), 0, 4 * (n * self.graph.width(s)) as u64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(Deferred { rec, reads, rows, n })
    }

    /// Writes `tokens` (the ids of a step [`Self::record_deferred`] recorded) and submits it;
    /// returns the reads of its rows for the next device. Its output is collected as a
    /// submitted step's.
    pub(super) fn submit_deferred(&mut self, d: Deferred, tokens: &[u32]) -> Result<Vec<PendingRead>, EngineError> {
        let vocab = self.graph.cfg.vocab;
        if tokens.len() != d.n {
            return Err(EngineError::Usage(format!("{} ids for a step recorded for {}", tokens.len(), d.n)));
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        self.ctx.write(&self.ids, 0, bytemuck::cast_slice(tokens)).map_err(|e| self.err(e))?;
        let Deferred { mut rec, reads, rows, .. } = d;
        let (dispatches, passes) = (rec.dispatch_count(), rec.pass_count());
        let submitted = rec.submit_and_clear();
        self.rec = Some(rec);
        submitted.map_err(|e| self.err(e))?;
        self.counters = StepCounters { dispatches, passes, submits: 1, host_ns: 0 };
        self.pending.push_back(reads);
        Ok(rows)
    }

    /// Reads the first `n` rows of each of `slots` after the steps submitted so far (one submit,
    /// one wait; `verify`: of the verification step's buffers): what a stage of a split model
    /// hands to the next.
    pub(super) fn read_rows(&mut self, slots: &[Slot], n: usize, verify: bool) -> Result<Vec<Vec<f32>>, EngineError> {
        let bufs = self.io_slots(n, verify)?;
        let mut rec = self.ctx.recorder();
        let reads =
            slots.iter().map(|&s| rec.read(bufs.buf(s), 0, 4 * (n * self.graph.width(s)) as u64)).collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))?;
        rec.submit().map_err(|e| self.err(e))?;
        reads.into_iter().map(|r| Ok(bytemuck::pod_collect_to_vec(&r.wait().map_err(|e| self.err(e))?))).collect()
    }
}

/// A step recorded and not yet submitted ([`GpuState::record_deferred`]): a stage of a split
/// model records while the device before it runs, and submits once that device's rows are in.
pub(super) struct Deferred {
    rec: Recorder,
    reads: Reads,
    /// The reads of the slots handed to the next device.
    rows: Vec<PendingRead>,
    n: usize,
}

/// What a recorded step reads back.
enum Reads {
    Nothing,
    Argmax(PendingRead),
    TopK(PendingRead, PendingRead, usize),
    Logits(PendingRead),
}

impl GpuState {
    /// Records a step into `rec` and returns its readbacks; with `early`, a prefill chunk's first dispatches are submitted
    /// on the way (see the module docs) and counted there.
    fn record(&mut self, rec: &mut Recorder, input: StepIds<'_>, pos: usize, want: Want, early: &mut Option<StepCounters>) -> Result<Reads, EngineError> {
        // A pending allowed-id mask belongs to this step, whatever becomes of it (a step that
        // fails must not leave it to a later one).
        let bits = std::mem::take(&mut self.bits.2);
        let vocab = self.graph.cfg.vocab;
        let n = match input {
            StepIds::Now(StepInput::Tokens(t)) => t.len(),
            StepIds::Now(StepInput::LastArgmax) => 1,
            StepIds::Later(n) => n,
        };
        if n == 0 || n > self.ubatch {
            return Err(EngineError::Usage(format!("a step of {n} tokens (1 ..= ubatch {})", self.ubatch)));
        }
        if pos + n > self.n_ctx {
            return Err(EngineError::ContextOverflow { tokens: pos + n, n_ctx: self.n_ctx });
        }
        self.window.check(pos)?;
        if let Want::TopK(k) = want
            && (k == 0 || k > self.topk.k())
        {
            return Err(EngineError::Usage(format!("top-{k} candidates (1 ..= {})", self.topk.k())));
        }
        let last_slot = match input {
            StepIds::Later(n) => n - 1,
            StepIds::Now(StepInput::Tokens(t)) => {
                if let Some(&id) = t.iter().find(|&&id| id as usize >= vocab) {
                    return Err(EngineError::TokenOutOfRange { id, vocab });
                }
                self.ctx.write(&self.ids, 0, bytemuck::cast_slice(t)).map_err(|e| self.err(e))?;
                n - 1
            }
            StepIds::Now(StepInput::LastArgmax) => {
                if !self.has_last {
                    return Err(EngineError::Usage("StepInput::LastArgmax without a previous argmax".into()));
                }
                self.ubatch
            }
        };
        self.has_last = want == Want::Argmax;
        self.window.ran(pos, n);
        // A single token runs the decode plan (GEMV) even when nothing is wanted of it; a chunk
        // runs the prefill plan (GEMM) over all of its tokens, then the LM head over its last row.
        let step = StepValues::decode(word("position", pos + n - 1)?);
        if n > 1 {
            let chunk = StepValues::chunk(word("position", pos)?, word("tokens", n)?).with_token(0);
            let lead = if early.is_some() { self.prefill_lead } else { 0 };
            let made = record_with_lead(rec, self.prefill.dispatches(), &chunk, lead).map_err(|e| self.err(e))?;
            if let Some(e) = early.as_mut() {
                (e.dispatches, e.passes, e.submits) = (e.dispatches + made.dispatches, e.passes + made.passes, e.submits + made.submits);
            }
            if want == Want::Nothing {
                return Ok(Reads::Nothing);
            }
            let row = 4 * self.graph.width(Slot::Normed) as u64;
            let (src, dst) = (self.pre_slots.buf(Slot::Normed).clone(), self.dec_slots.buf(Slot::Normed).clone());
            rec.copy(&src, (n as u64 - 1) * row, &dst, 0, row).map_err(|e| self.err(e))?;
            self.head.record(rec, &step).map_err(|e| self.err(e))?;
        } else {
            self.decode.record(rec, &step.with_token(word("slot", last_slot)?)).map_err(|e| self.err(e))?;
            if want == Want::Nothing {
                return Ok(Reads::Nothing);
            }
        }
        // A constraint's mask on the logits row, before anything reads it.
        if bits {
            self.bits.1.record(rec, &StepValues::chunk(0, 1)).map_err(ops_err)?;
        }
        Ok(match want {
            Want::Argmax => {
                if let Some((_, _, mask)) = &self.mask {
                    mask.record(rec, &step).map_err(ops_err)?;
                }
                self.argmax.record(rec, &step.with_token(0)).map_err(ops_err)?;
                let target = self.argmax_reads.iter().find(|t| !t.is_busy());
                let read = match target {
                    Some(t) => rec.read_into(t, &self.ids, 4 * self.ubatch as u64, 4),
                    None => rec.read(&self.ids, 4 * self.ubatch as u64, 4),
                };
                Reads::Argmax(read.map_err(|e| self.err(e))?)
            }
            Want::TopK(k) => {
                self.topk.record(rec, &step.with_token(0)).map_err(ops_err)?;
                let (iv, vv, kk) = (self.topk.ids().clone(), self.topk.values().clone(), self.topk.k() as u64);
                let ids = rec.read(iv.buffer(), iv.byte_offset(), 4 * kk).map_err(|e| self.err(e))?;
                let vals = rec.read(vv.buffer(), vv.byte_offset(), 4 * kk).map_err(|e| self.err(e))?;
                Reads::TopK(ids, vals, k)
            }
            Want::Logits => Reads::Logits(rec.read(self.dec_slots.buf(Slot::Logits), 0, 4 * vocab as u64).map_err(|e| self.err(e))?),
            Want::Nothing => unreachable!("returned above"),
        })
    }

    fn collect_reads(&mut self, reads: Reads) -> Result<StepOutput, EngineError> {
        Ok(match reads {
            Reads::Nothing => StepOutput::Nothing,
            Reads::Argmax(r) => StepOutput::Argmax(r.wait_with(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).map_err(|e| self.err(e))?),
            Reads::TopK(ids, vals, k) => {
                let ids = ids.wait_u32().map_err(|e| self.err(e))?;
                let vals = vals.wait().map_err(|e| self.err(e))?;
                let vals: &[f32] = bytemuck::cast_slice(&vals);
                StepOutput::TopK(ids.into_iter().zip(vals.iter().copied()).take(k).collect())
            }
            Reads::Logits(r) => StepOutput::Logits(bytemuck::cast_slice(&r.wait().map_err(|e| self.err(e))?).to_vec()),
        })
    }
}

impl BackendState for GpuState {
    fn submit(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(), EngineError> {
        if self.pending.len() >= MAX_IN_FLIGHT {
            return Err(EngineError::Usage(format!("a step submitted with {MAX_IN_FLIGHT} outstanding (collect one first)")));
        }
        let start = std::time::Instant::now();
        let traced = self.trace.start();
        let mut rec = self.rec.take().unwrap_or_else(|| self.ctx.recorder());
        let mut early = Some(StepCounters::default());
        let reads = self.record(&mut rec, StepIds::Now(input), pos, want, &mut early)?;
        let e = early.unwrap_or_default();
        let (dispatches, passes) = (e.dispatches + rec.dispatch_count(), e.passes + rec.pass_count());
        let submitted = rec.submit_and_clear();
        self.rec = Some(rec);
        submitted.map_err(|e| self.err(e))?;
        self.counters = StepCounters { dispatches, passes, submits: e.submits + 1, host_ns: start.elapsed().as_nanos() as u64 };
        self.pending.push_back(reads);
        self.trace.submitted(traced);
        Ok(())
    }

    fn collect(&mut self) -> Result<StepOutput, EngineError> {
        let reads = self.pending.pop_front().ok_or_else(|| EngineError::Usage("collecting a step that was not submitted".into()))?;
        let traced = self.trace.start();
        let out = self.collect_reads(reads);
        self.trace.collected(traced);
        out
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn applies_step_bits(&self) -> bool {
        true
    }

    fn set_step_bits(&mut self, bits: &[u32]) -> Result<(), EngineError> {
        super::super::backend::check_mask_words(self.graph.cfg.vocab, bits)?;
        self.ctx.write(&self.bits.0, 0, bytemuck::cast_slice(bits)).map_err(|e| self.err(e))?;
        self.bits.2 = true;
        Ok(())
    }

    fn set_argmax_mask(&mut self, ids: &[u32]) -> Result<(), EngineError> {
        if self.mask.as_ref().map(|m| m.0.as_slice()).unwrap_or(&[]) == ids {
            return Ok(());
        }
        self.mask = if ids.is_empty() {
            None
        } else {
            let buf = self.ctx.upload(bytemuck::cast_slice(ids)).map_err(|e| self.err(e))?;
            let logits = GpuView::whole(self.dec_slots.buf(Slot::Logits));
            let plan = MaskPlan::new(&self.ctx, &logits, self.graph.cfg.vocab, &GpuView::whole(&buf), ids.len()).map_err(ops_err)?;
            Some((ids.to_vec(), buf, plan))
        };
        Ok(())
    }

    fn profile_step(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(StepOutput, Vec<KernelTime>), EngineError> {
        if !self.pending.is_empty() {
            return Err(EngineError::Usage("a profiled step with steps outstanding (collect them first)".into()));
        }
        let mut rec = self.ctx.recorder();
        // One profiled submit holds the whole step.
        let reads = self.record(&mut rec, StepIds::Now(input), pos, want, &mut None)?;
        let profile = rec.submit_profiled().map_err(|e| self.err(e))?;
        let times = profile.by_label().into_iter().map(|(label, (ns, count))| KernelTime { label, ns, count }).collect();
        Ok((self.collect_reads(reads)?, times))
    }

    fn resume_floor(&self) -> usize {
        self.window.floor()
    }

    fn verify(&mut self, tokens: &[u32], pos: usize, want: Want) -> Result<Vec<StepOutput>, EngineError> {
        self.verify_step(tokens, pos, want)
    }

    fn profile_verify(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<KernelTime>, EngineError> {
        self.profile_verify_step(tokens, pos)
    }

    fn prepare_verify(&mut self) -> Result<(), EngineError> {
        if self.verify.is_none() {
            self.verify = Some(self.build_verify()?);
        }
        Ok(())
    }

    fn reset(&mut self) -> Result<(), EngineError> {
        while let Some(r) = self.pending.pop_front() {
            self.collect_reads(r)?;
        }
        self.has_last = false;
        self.trace.flush();
        Ok(())
    }

    fn last_step_counters(&self) -> StepCounters {
        self.counters
    }
}
