//! Many sequences on the GPU: a paged KV cache, the batched plan over a step's rows, and the LM
//! head over the rows that want logits. One step is ONE recording, submitted in a few parts of
//! doubling size so the GPU starts while the host encodes the rest ([`super::lead`]), and its
//! dispatch count does not grow with the number of sequences:
//!
//! 1. the step's token ids and its batch (each row's table offset and position, the tables;
//!    for conv layers each sequence's slot) are written to buffers made once
//!    ([`PagedBatch::set`], [`ConvSeqs::set`]);
//! 2. the batched plans ([`Mode::Batch`]) run the graph over the rows, one [`Lane`] of rows
//!    each: in a batch state of few sequences the decode rows in a lane of their own whose
//!    plan is fused as a verification plan (the multi-row GEMV reading the weights once per
//!    group of rows, the RMSNorm and the GLU in its quantizer or prologue, the residual add
//!    in its output), the prompt rows in the main lane through the GEMM kernels
//!    (cooperative-matrix where the adapter has them) as one product; in a large one every row
//!    in the main lane through the GEMM. Each plan runs QK-norm + RoPE at each row's position,
//!    the paged KV write, and paged attention whose key chunks a row's own length decides
//!    (`plan_ops::attention::batch_attn_splits`; so a row's numbers never depend on the other
//!    rows); LFM2's short conv runs every sequence's tokens
//!    against its slot's ring in one dispatch;
//! 3. the LM head (one matrix product) over the last row of every sequence that wants logits,
//!    read from the first lane's `Normed` rows directly when they are its first rows (a step of
//!    decode rows), else gathered by buffer copies;
//! 4. constrained sequences' allowed-id masks ([`BatchEntry::mask`]) applied to their head
//!    rows in one dispatch ([`MaskBitsPlan`]), then
//!    argmax over every head row in two dispatches and top-k (the `MAX_TOP_K` best raw logits)
//!    over every head row in one dispatch per round, where some sequence wants them; one
//!    readback: the ids, the candidates of the sequences that sample from top-k, and the whole
//!    logits rows of those that need them (penalties, `top_logprobs`, no top-k).

use std::sync::Arc;

use boostr::conv::{ConvSeq, ConvSeqs};
use boostr::ops_common::GpuView;
use boostr::ops_common::OpPlan;
use boostr::paged::{BatchSeq, PagedBatch, PagedKvCache, PagedKvConfig};
use boostr::sampling::{ArgmaxPlan, MaskBitsPlan, TopKPlan};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, Plan, Recorder, StepValues};

use super::super::EngineError;
use super::super::backend::{CONV_RING, KernelTime, MAX_TOP_K, StepCounters, StepOutput, Want};
use super::super::batch::{BatchEntry, BatchOpts, BatchState, check_entries};
use super::super::graph::{ModelGraph, Op, Slot};
use super::fuse::split_qkv_rows;
use super::lead::record_with_lead;
use super::plans::{Mode, PlanInputs, Slots, build, build_head_rows, inv_freqs, kv_dtype};
use super::tuning::batch_op_split_k;
use super::weights::GpuWeights;
use super::{GpuBackend, dev_err, ops_err};

mod step;
pub(super) use step::LaneRows;

pub(crate) struct GpuBatch {
    ctx: Arc<GpuContext>,
    graph: Arc<ModelGraph>,
    device: String,
    opts: BatchOpts,
    _weights: Arc<GpuWeights>,
    _cache: PagedKvCache,
    _freqs: Vec<Arc<GpuBuffer>>,
    /// Per conv layer, every slot's ring `[max_seqs][CONV_RING][dim]`.
    _conv: Vec<Arc<GpuBuffer>>,
    /// The decode entries' lane (a batch state whose decode rows take the multi-row GEMV): every
    /// row a decode row, fused as a verification plan is ([`Lane`]).
    decode: Option<Lane>,
    /// The other entries' lane (prompt chunks; every entry where there is no decode lane). Its
    /// slots hold the head's logits.
    main: Lane,
    /// The head's input rows when they are gathered.
    head_in: Arc<GpuBuffer>,
    /// The LM head over the `Normed` rows / over `head_in` (`None`: a stage of a split model
    /// without the LM head, whose steps want nothing).
    head_direct: Option<Plan>,
    head_gather: Option<Plan>,
    argmax: ArgmaxPlan,
    /// The `MAX_TOP_K` best raw logits of every head row (the sampling rows' candidates).
    topk: TopKPlan,
    rec: Option<Recorder>,
    counters: StepCounters,
    /// Host staging of a step's ids.
    scratch: Vec<u32>,
    /// Dispatches of a step's first early submit ([`super::lead`]; `GpuTuning::prefill_lead`).
    lead: usize,
    /// Constrained sequences' allowed-id masks (one per sequence, `ceil(vocab / 32)` words
    /// each), the head row each goes to, and the plan applying them before argmax / top-k.
    mask_bits: Arc<GpuBuffer>,
    mask_rows: Arc<GpuBuffer>,
    mask: MaskBitsPlan,
    /// Host staging of a step's mask rows.
    mask_scratch: Vec<u32>,
}

/// An entry's first head row and count (`None`: it wants nothing).
type HeadRows = Option<(usize, usize)>;

/// One lane of a batched step: the rows of one kind through a plan of their own, with their
/// own ids, batch (positions, tables), conv runs and activation slots, over the shared paged
/// cache. A decode row always runs through the decode lane's fused plan and a prompt row
/// through the main lane's, so a row's numbers never depend on what else is in the step.
struct Lane {
    batch: PagedBatch,
    ids: Arc<GpuBuffer>,
    conv_seqs: Option<ConvSeqs>,
    slots: Slots,
    plan: Plan,
}

/// What a lane's plans read besides its own buffers.
struct Shared<'a> {
    b: &'a GpuBackend,
    opts: &'a BatchOpts,
    cache: &'a PagedKvCache,
    freqs: &'a [Arc<GpuBuffer>],
    conv: &'a [Arc<GpuBuffer>],
}

impl Lane {
    /// A lane of up to `rows` rows: `rows_only` (every row a decode row, fused) or mixed
    /// (prompt rows through the GEMM, decode rows, if `decode_gemv`, through the multi-row
    /// GEMV); `logit_rows` rows of logits in its slots.
    fn new(sh: &Shared<'_>, rows: usize, rows_only: bool, decode_gemv: bool, logit_rows: usize) -> Result<Lane, EngineError> {
        let (ctx, g, opts) = (&sh.b.ctx, &sh.b.graph, sh.opts);
        let entries = opts.max_seqs.saturating_mul(opts.blocks_per_seq()).max(1);
        let batch = PagedBatch::new(ctx, rows, entries, opts.block_len).map_err(ops_err)?;
        let ids = ctx.alloc(4 * rows as u64, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        let conv_seqs = if sh.conv.is_empty() { None } else { Some(ConvSeqs::new(ctx, rows, opts.max_seqs).map_err(ops_err)?) };
        // A Q/K/V projection split over K leaves its partials in the Q/K/V slot for the RoPE
        // op to sum (a plan of every row through the GEMM, `fuse::fuse_split_sums`).
        let qkv_parts = if rows_only || decode_gemv { 1 } else { split_qkv_rows(&g.ops, &|i| batch_op_split_k(ctx, g, &sh.b.weights, &sh.b.tuning, i, rows)) };
        let slots = Slots::with_logit_rows(ctx, g, rows, qkv_parts, logit_rows)?;
        let mut lane = Lane { batch, ids, conv_seqs, slots, plan: Plan::new() };
        let inp = lane.inputs(sh, rows_only, decode_gemv);
        lane.plan = build(ctx, &inp, &lane.slots, Mode::Batch { max_tok: rows })?;
        Ok(lane)
    }

    fn inputs<'a>(&'a self, sh: &Shared<'a>, rows_only: bool, decode_gemv: bool) -> PlanInputs<'a> {
        PlanInputs {
            graph: &sh.b.graph,
            weights: &sh.b.weights,
            cache: None,
            paged: Some((sh.cache, &self.batch)),
            paged_ctx: sh.opts.n_ctx,
            ids: &self.ids,
            freqs: sh.freqs,
            conv: sh.conv,
            conv_seqs: self.conv_seqs.as_ref(),
            decode_gemv: sh.b.decode_gemv,
            tuning: &sh.b.tuning,
            batch_decode_gemv: decode_gemv,
            prefill_gemv: false,
            rows_only,
        }
    }

    /// Writes the step's ids, batch and conv runs for `entries`; the values its plan runs with.
    fn set(&self, ctx: &GpuContext, entries: &[BatchEntry<'_>], scratch: &mut Vec<u32>) -> Result<StepValues, EngineError> {
        scratch.clear();
        let mut seqs = Vec::with_capacity(entries.len());
        for e in entries {
            seqs.push(BatchSeq { table: e.table, pos: e.pos, n_tok: e.tokens.len() });
            scratch.extend_from_slice(e.tokens);
        }
        ctx.write(&self.ids, 0, bytemuck::cast_slice(scratch)).map_err(|e| dev_err(ctx, e))?;
        let decode_rows: usize = entries.iter().take_while(|e| e.decode).map(|e| e.tokens.len()).sum();
        let step = self.batch.set(ctx, &seqs).map_err(ops_err)?.with_decode_rows(decode_rows as u32);
        if let Some(cs) = &self.conv_seqs {
            let runs: Vec<ConvSeq> = entries.iter().map(|e| ConvSeq { slot: e.slot, pos: e.pos, n_tok: e.tokens.len() }).collect();
            cs.set(ctx, &runs).map_err(ops_err)?;
        }
        Ok(step)
    }
}

impl GpuBatch {
    pub(crate) fn new(b: &GpuBackend, opts: &BatchOpts) -> Result<GpuBatch, EngineError> {
        opts.check()?;
        let (ctx, g) = (&b.ctx, &b.graph);
        let c = &g.cfg;
        let dtype = kv_dtype(opts.kv)?;
        if !PagedKvConfig::supports_head_dim(dtype, c.head_dim) {
            return Err(EngineError::Unsupported {
                what: format!("a paged {dtype} KV cache of head size {} (a multiple of 8 up to 256; q8_0: of 32)", c.head_dim),
            });
        }
        let cfg = PagedKvConfig {
            n_layers: c.kv_layers().max(1),
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            block_len: opts.block_len,
            n_blocks: opts.n_blocks,
            dtype,
            max_buffer_bytes: None,
        };
        let cache = PagedKvCache::new(ctx, cfg).map_err(ops_err)?;
        let dummy = ctx.alloc(16, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        let mut freqs = vec![dummy.clone(); c.n_layers];
        for op in &g.ops {
            if let Op::QkvRope { layer, .. } = op {
                let f = inv_freqs(g, &b.weights, op)?;
                freqs[*layer] = ctx.upload(bytemuck::cast_slice(&f)).map_err(|e| dev_err(ctx, e))?;
            }
        }
        let mut conv = Vec::with_capacity(c.conv_layers());
        for _ in 0..c.conv_layers() {
            let bytes = (4 * CONV_RING * c.dim) as u64 * opts.max_seqs as u64;
            let ring = ctx.alloc(bytes, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
            ctx.with_stream(|rec| rec.clear(&ring)).map_err(|e| dev_err(ctx, e))?;
            conv.push(ring);
        }
        let heads = opts.head_rows();
        let sh = Shared { b, opts, cache: &cache, freqs: &freqs, conv: &conv };
        // Decode rows through the multi-row GEMV in a lane of their own (a batch state of few
        // sequences, `GpuTuning::batch_gemv_max_seqs`; `batch_lanes` off: in the main lane, unfused),
        // else every row through the GEMM.
        let gemv_rows = opts.max_seqs <= b.tuning.batch_gemv_max_seqs;
        let lanes = gemv_rows && b.tuning.batch_lanes;
        let decode = if lanes { Some(Lane::new(&sh, opts.max_decode_rows(), true, true, 1)?) } else { None };
        let main = Lane::new(&sh, opts.max_tokens, false, gemv_rows && !lanes, heads)?;
        let inp = main.inputs(&sh, false, gemv_rows);
        let dim = g.width(Slot::Normed);
        let head_in = ctx.alloc((4 * dim * heads) as u64, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        let logits = main.slots.bind(Slot::Logits);
        let direct_rows = heads.min(if lanes { opts.max_decode_rows() } else { opts.max_tokens });
        let first = decode.as_ref().unwrap_or(&main);
        let has_head = g.ops.iter().any(|op| matches!(op, Op::LmHead { .. }));
        let (head_direct, head_gather) = if has_head {
            (
                Some(build_head_rows(ctx, &inp, &main.slots, first.slots.bind(Slot::Normed), logits.clone(), direct_rows)?),
                Some(build_head_rows(ctx, &inp, &main.slots, Binding::whole(&head_in), logits, heads)?),
            )
        } else {
            (None, None)
        };
        let slots = &main.slots;
        let argmax = ArgmaxPlan::rows(ctx, &slots.view(Slot::Logits), c.vocab, heads, None).map_err(ops_err)?;
        let topk = TopKPlan::rows(ctx, &slots.view(Slot::Logits), c.vocab, MAX_TOP_K.min(c.vocab), heads).map_err(ops_err)?;
        let max_masks = opts.max_seqs.min(heads).max(1);
        let words = c.vocab.div_ceil(32);
        let mask_bits = ctx.alloc((4 * words * max_masks) as u64, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        let mask_rows = ctx.alloc((4 * max_masks) as u64, BufferKind::Storage).map_err(|e| dev_err(ctx, e))?;
        let mask = MaskBitsPlan::new(ctx, &slots.view(Slot::Logits), c.vocab, heads, &GpuView::whole(&mask_bits), &GpuView::whole(&mask_rows), max_masks)
            .map_err(ops_err)?;
        Ok(GpuBatch {
            ctx: ctx.clone(),
            graph: g.clone(),
            device: b.device.clone(),
            opts: *opts,
            _weights: b.weights.clone(),
            _cache: cache,
            _freqs: freqs,
            _conv: conv,
            decode,
            main,
            head_in,
            head_direct,
            head_gather,
            argmax,
            topk,
            rec: Some(ctx.recorder()),
            counters: StepCounters::default(),
            scratch: Vec::with_capacity(opts.max_tokens),
            lead: b.tuning.prefill_lead,
            mask_bits,
            mask_rows,
            mask,
            mask_scratch: Vec::with_capacity(max_masks),
        })
    }

    fn err(&self, e: numr::NumrError) -> EngineError {
        EngineError::Device { device: self.device.clone(), reason: e.to_string() }
    }

    /// Records the step into `rec`; returns each entry's first head row and count (`None`:
    /// wants nothing), and what went out in early submits of the plan's first dispatches
    /// (`lead`: the first one's size, 0 for none; [`super::lead`]). `entries` hold their decode
    /// entries first ([`decode_first`]).
    fn record(&mut self, rec: &mut Recorder, entries: &[BatchEntry<'_>], lead: usize) -> Result<(Vec<HeadRows>, StepCounters), EngineError> {
        // The decode entries to the decode lane (where there is one), the rest to the main lane;
        // each lane's rows start at 0 in its own buffers.
        let n_dec = if self.decode.is_some() { entries.iter().take_while(|e| e.decode).count() } else { 0 };
        let (dec, rest) = entries.split_at(n_dec);
        let mut early = StepCounters::default();
        let mut lead = lead;
        // Each entry's lane (0: decode, 1: main) and last row there.
        let mut last_rows = Vec::with_capacity(entries.len());
        for (k, group) in [dec, rest].into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let lane = if k == 0 { self.decode.as_ref().expect("decode entries go to the decode lane") } else { &self.main };
            let step = lane.set(&self.ctx, group, &mut self.scratch)?;
            let mut row = 0;
            for e in group {
                row += e.tokens.len();
                last_rows.push((k, row - 1));
            }
            let e = record_with_lead(rec, lane.plan.dispatches(), &step, lead).map_err(|e| self.err(e))?;
            (early.dispatches, early.passes, early.submits) = (early.dispatches + e.dispatches, early.passes + e.passes, early.submits + e.submits);
            lead = 0;
        }
        let mut head = Vec::with_capacity(entries.len());
        let mut wanted = Vec::new();
        for (e, &(lane, row)) in entries.iter().zip(&last_rows) {
            if e.want == Want::Nothing {
                head.push(None);
            } else {
                head.push(Some((wanted.len(), e.out_rows)));
                wanted.extend((row + 1 - e.out_rows..=row).map(|r| (lane, r)));
            }
        }
        let m = wanted.len();
        if m == 0 {
            return Ok((head, early));
        }
        let (Some(head_direct), Some(head_gather)) = (&self.head_direct, &self.head_gather) else {
            return Err(EngineError::Usage("an output from a stage of a split model without the LM head".into()));
        };
        // Every head row through the decode-row GEMV (the head has no prompt rows). The rows are
        // read in place when they are the first lane's first rows in order (a step of decode
        // rows), else gathered.
        let rows = StepValues::chunk(0, m as u32).with_decode_rows(m as u32);
        let first = if self.decode.is_some() { 0 } else { 1 };
        if wanted.iter().enumerate().all(|(j, &r)| r == (first, j)) && m <= self.opts.max_tokens.min(self.opts.head_rows()) {
            head_direct.record(rec, &rows).map_err(|e| self.err(e))?;
        } else {
            let row = 4 * self.graph.width(Slot::Normed) as u64;
            for (j, &(lane, r)) in wanted.iter().enumerate() {
                let src = if lane == 0 { self.decode.as_ref().expect("a decode lane row") } else { &self.main }.slots.buf(Slot::Normed);
                rec.copy(src, r as u64 * row, &self.head_in, j as u64 * row, row).map_err(|e| self.err(e))?;
            }
            head_gather.record(rec, &rows).map_err(|e| self.err(e))?;
        }
        // Constrained sequences' masks on their head rows, before anything reads them.
        self.mask_scratch.clear();
        let words = self.graph.cfg.vocab.div_ceil(32);
        for (e, h) in entries.iter().zip(&head) {
            if let (Some(m), Some((j, _))) = (e.mask, h) {
                let k = self.mask_scratch.len();
                if k == self.mask.max_masks() {
                    return Err(EngineError::Usage(format!("a step of more than {k} allowed-id masks")));
                }
                self.ctx.write(&self.mask_bits, (4 * words * k) as u64, bytemuck::cast_slice(m)).map_err(|e| self.err(e))?;
                self.mask_scratch.push(*j as u32);
            }
        }
        if !self.mask_scratch.is_empty() {
            self.ctx.write(&self.mask_rows, 0, bytemuck::cast_slice(&self.mask_scratch)).map_err(|e| self.err(e))?;
            self.mask.record(rec, &StepValues::chunk(0, self.mask_scratch.len() as u32)).map_err(ops_err)?;
        }
        if entries.iter().any(|e| e.want == Want::Argmax) {
            self.argmax.record(rec, &rows).map_err(ops_err)?;
        }
        if entries.iter().any(|e| matches!(e.want, Want::TopK(_))) {
            self.topk.record(rec, &rows).map_err(ops_err)?;
        }
        Ok((head, early))
    }
}

impl BatchState for GpuBatch {
    fn opts(&self) -> &BatchOpts {
        &self.opts
    }

    fn step(&mut self, entries: &[BatchEntry<'_>]) -> Result<Vec<StepOutput>, EngineError> {
        check_entries(&self.opts, self.graph.cfg.vocab, entries)?;
        let (order, sorted) = decode_first(entries);
        let mut outs: Vec<Option<StepOutput>> = self.step_sorted(&sorted)?.into_iter().map(Some).collect();
        Ok(order.iter().map(|&j| outs[j].take().expect("a permutation")).collect())
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), EngineError> {
        if let Some(&(s, d)) = pairs.iter().find(|&&(s, d)| s.max(d) as usize >= self.opts.n_blocks) {
            return Err(EngineError::Usage(format!("a copy of block {s} into {d} in a cache of {} blocks", self.opts.n_blocks)));
        }
        // Through the context's stream, which goes out before the next step's recording.
        let cache = &self._cache;
        let mut failed = None;
        self.ctx
            .with_stream(|rec| {
                for &(s, d) in pairs {
                    if let Err(e) = cache.copy_block(rec, s, d) {
                        failed = Some(e);
                        break;
                    }
                }
                Ok(())
            })
            .map_err(|e| self.err(e))?;
        failed.map_or(Ok(()), |e| Err(ops_err(e)))
    }

    fn last_step_counters(&self) -> StepCounters {
        self.counters
    }

    fn profile_step(&mut self, entries: &[BatchEntry<'_>]) -> Result<Vec<KernelTime>, EngineError> {
        check_entries(&self.opts, self.graph.cfg.vocab, entries)?;
        let (_, sorted) = decode_first(entries);
        // A recorder of its own: one profiled submit holds the whole step.
        let mut rec = self.ctx.recorder();
        self.record(&mut rec, &sorted, 0)?;
        let profile = rec.submit_profiled().map_err(|e| self.err(e))?;
        Ok(profile.by_label().into_iter().map(|(label, (ns, count))| KernelTime { label, ns, count }).collect())
    }
}

/// The entries with the decode entries first (each group in its order), and for each original
/// entry its index in that order.
pub(super) fn decode_first<'a>(entries: &[BatchEntry<'a>]) -> (Vec<usize>, Vec<BatchEntry<'a>>) {
    let sorted: Vec<BatchEntry<'a>> = entries.iter().filter(|e| e.decode).chain(entries.iter().filter(|e| !e.decode)).copied().collect();
    let n_dec = entries.iter().filter(|e| e.decode).count();
    let (mut d, mut p) = (0, n_dec);
    let order = entries
        .iter()
        .map(|e| {
            let at = if e.decode { &mut d } else { &mut p };
            *at += 1;
            *at - 1
        })
        .collect();
    (order, sorted)
}
