//! Many sequences on the CPU: a paged KV cache (`[block][kv_head][block_len][head_dim]` per
//! layer, rounded to the cache type as the sequence state's) and a step over several sequences'
//! tokens at once.
//!
//! The row-wise ops (embedding, norms, mat-muls, bias, GLU) run once over all the step's rows,
//! as [`super::state::CpuState`] runs them over a chunk. RoPE with the KV write, attention, the
//! short conv and the LM head run per sequence on the same functions a sequence alone uses: its
//! blocks are gathered into a contiguous cache for the call and its new rows scattered back. So a
//! sequence's numbers are those it has alone (the mat-mul's tiles give the same bits for a row
//! wherever it sits). Correctness is the point here, not speed.

use std::sync::Arc;

use boostr::kv_cache::KvDtype;
use boostr::paged::BlockTable;

use super::Model;
use super::attention::{AttnShape, attention};
use super::matmul::linear;
use super::ops::{Heads, qkv_rope};
use super::state::{SLOTS, ops_err, run_rowwise, slot_index, top_k, zeros};
use super::{CpuOp, Pool};
use crate::engine::EngineError;
use crate::engine::backend::{CONV_RING, KvType, StepCounters, StepOutput, Want};
use crate::engine::batch::{BatchEntry, BatchOpts, BatchState, check_entries};
use crate::engine::graph::Slot;

/// The paged state of a batch on the CPU.
pub(super) struct CpuBatch {
    model: Arc<Model>,
    opts: BatchOpts,
    kv: Option<KvDtype>,
    /// By [`slot_index`]: `max_tokens` rows of the slot's width (logits: one row).
    slots: Vec<Arc<Vec<f32>>>,
    /// Per cache layer, `n_blocks` blocks of `[kv_head][block_len][head_dim]`.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Per sequence slot, per conv layer: the ring of `Bx` rows `[CONV_RING][dim]`.
    conv: Vec<Vec<Vec<f32>>>,
}

/// Where one entry's rows sit in the step.
struct Span<'a> {
    slot: usize,
    row: usize,
    n: usize,
    pos: usize,
    table: &'a BlockTable,
    want: Want,
    /// Rows (the last ones) whose logits come back.
    out_rows: usize,
}

impl CpuBatch {
    pub(super) fn new(model: Arc<Model>, opts: &BatchOpts) -> Result<CpuBatch, EngineError> {
        opts.check()?;
        let c = &model.cfg;
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
            let rows = if s == Slot::Logits { 1 } else { opts.max_tokens };
            slots.push(zeros(rows.checked_mul(w), "activations")?);
        }
        let per_layer = opts.n_blocks.checked_mul(c.n_kv_heads * opts.block_len * c.head_dim);
        let mut keys = Vec::with_capacity(c.kv_layers());
        let mut values = Vec::with_capacity(c.kv_layers());
        for _ in 0..c.kv_layers() {
            keys.push(Arc::unwrap_or_clone(zeros(per_layer, "the KV cache")?));
            values.push(Arc::unwrap_or_clone(zeros(per_layer, "the KV cache")?));
        }
        let conv =
            (0..if c.conv_layers() > 0 { opts.max_seqs } else { 0 }).map(|_| (0..c.conv_layers()).map(|_| vec![0.0; CONV_RING * c.dim]).collect()).collect();
        Ok(CpuBatch { model, opts: *opts, kv, slots, keys, values, conv })
    }

    /// Index of position `p`'s row of KV head `j` in a layer's block storage.
    fn at(&self, table: &BlockTable, j: usize, p: usize) -> usize {
        let (bl, c) = (self.opts.block_len, &self.model.cfg);
        let block = table.blocks()[p / bl] as usize;
        ((block * c.n_kv_heads + j) * bl + p % bl) * c.head_dim
    }

    /// The layer's positions `0 .. len` of a sequence as a contiguous `[kv_head][len][head_dim]`.
    fn gather(&self, layer: usize, table: &BlockTable, len: usize) -> (Vec<f32>, Vec<f32>) {
        let (nkv, hd) = (self.model.cfg.n_kv_heads, self.model.cfg.head_dim);
        let (mut k, mut v) = (vec![0.0; nkv * len * hd], vec![0.0; nkv * len * hd]);
        for j in 0..nkv {
            for p in 0..len {
                let (src, dst) = (self.at(table, j, p), (j * len + p) * hd);
                k[dst..dst + hd].copy_from_slice(&self.keys[layer][src..src + hd]);
                v[dst..dst + hd].copy_from_slice(&self.values[layer][src..src + hd]);
            }
        }
        (k, v)
    }

    /// Positions `from .. len` of a contiguous `[kv_head][len][head_dim]` into the blocks.
    fn scatter(&mut self, layer: usize, table: &BlockTable, len: usize, from: usize, k: &[f32], v: &[f32]) {
        let (nkv, hd) = (self.model.cfg.n_kv_heads, self.model.cfg.head_dim);
        for j in 0..nkv {
            for p in from..len {
                let (dst, src) = (self.at(table, j, p), (j * len + p) * hd);
                self.keys[layer][dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                self.values[layer][dst..dst + hd].copy_from_slice(&v[src..src + hd]);
            }
        }
    }

    /// One op over the step: row-wise over every row, else per sequence.
    fn run(&mut self, op: &CpuOp, pool: &mut Pool, ids: &[u32], spans: &[Span<'_>], logits: &mut [Vec<f32>]) -> Result<(), EngineError> {
        let model = self.model.clone();
        if run_rowwise(&model, &mut self.slots, pool, op, ids)? {
            return Ok(());
        }
        let (c, k) = (&model.cfg, model.kernels);
        let qkv_w = model.widths[slot_index(Slot::Qkv)];
        for (i, s) in spans.iter().enumerate() {
            let len = s.pos + s.n;
            match op {
                CpuOp::QkvRope { layer, qk_norm, rope, freqs } => {
                    let (mut kc, mut vc) = self.gather(*layer, s.table, len);
                    let h = Heads { n_q: c.n_heads, n_kv: c.n_kv_heads, head_dim: c.head_dim, n_ctx: len };
                    let qkv = &mut Arc::make_mut(&mut self.slots[slot_index(Slot::Qkv)])[s.row * qkv_w..(s.row + s.n) * qkv_w];
                    let norm = qk_norm.as_ref().map(|(q, k)| (&q[..], &k[..]));
                    qkv_rope(h, qkv, s.n, s.pos, norm, c.norm_eps, rope, freqs, self.kv, &mut kc, &mut vc).map_err(ops_err)?;
                    self.scatter(*layer, s.table, len, s.pos, &kc, &vc);
                }
                CpuOp::Attention { layer, window } => {
                    let (kc, vc) = self.gather(*layer, s.table, len);
                    let shape = AttnShape {
                        n_heads: c.n_heads,
                        n_kv: c.n_kv_heads,
                        head_dim: c.head_dim,
                        n_ctx: len,
                        window: *window,
                        scale: c.attn_scale,
                        softcap: c.attn_softcap,
                    };
                    let qkv = Arc::new(self.slots[slot_index(Slot::Qkv)][s.row * qkv_w..(s.row + s.n) * qkv_w].to_vec());
                    let aw = model.widths[slot_index(Slot::Attn)];
                    let o = &mut Arc::make_mut(&mut self.slots[slot_index(Slot::Attn)])[s.row * aw..(s.row + s.n) * aw];
                    attention(pool, k, shape, &qkv, &Arc::new(kc), &Arc::new(vc), s.pos, s.n, o)?;
                }
                CpuOp::ShortConv { state, conv, w } => {
                    let d = c.dim;
                    let ring = &mut self.conv[s.slot][*state];
                    if s.pos == 0 {
                        ring.fill(0.0);
                    }
                    let bcx = &self.slots[slot_index(Slot::ConvIn)][s.row * 3 * d..(s.row + s.n) * 3 * d];
                    let y = conv.reference(bcx, w, ring, s.pos, s.n, d).map_err(ops_err)?;
                    Arc::make_mut(&mut self.slots[slot_index(Slot::Conv)])[s.row * d..(s.row + s.n) * d].copy_from_slice(&y);
                }
                CpuOp::LmHead { g, softcap } => {
                    if s.want == Want::Nothing {
                        continue;
                    }
                    let xs = self.slots[slot_index(Slot::Normed)].clone();
                    let o = &mut logits[i];
                    o.resize(c.vocab * s.out_rows, 0.0);
                    linear(pool, k, model.int8, g, &xs, s.row + s.n - s.out_rows, s.out_rows, o, c.vocab)?;
                    if let Some(cap) = softcap {
                        o.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
                    }
                }
                _ => unreachable!("row-wise ops ran above"),
            }
        }
        Ok(())
    }
}

impl BatchState for CpuBatch {
    fn opts(&self) -> &BatchOpts {
        &self.opts
    }

    fn step(&mut self, entries: &[BatchEntry<'_>]) -> Result<Vec<StepOutput>, EngineError> {
        check_entries(&self.opts, self.model.cfg.vocab, entries)?;
        let mut ids = Vec::new();
        let mut spans = Vec::with_capacity(entries.len());
        for e in entries {
            spans.push(Span { slot: e.slot, row: ids.len(), n: e.tokens.len(), pos: e.pos, table: e.table, want: e.want, out_rows: e.out_rows });
            ids.extend_from_slice(e.tokens);
        }
        let mut logits = vec![Vec::new(); entries.len()];
        let model = self.model.clone();
        {
            let mut pool = model.pool.lock().unwrap_or_else(|e| e.into_inner());
            for op in &model.ops {
                self.run(op, &mut pool, &ids, &spans, &mut logits)?;
            }
        }
        // Constrained sequences' allowed-id masks (one output row each, checked above).
        for (e, rows) in entries.iter().zip(logits.iter_mut()) {
            if let (Some(m), false) = (e.mask, rows.is_empty()) {
                boostr::sampling::mask_bits_ref(rows, m);
            }
        }
        Ok(spans
            .iter()
            .zip(logits)
            .map(|(s, rows)| {
                let one = |row: &[f32]| match s.want {
                    Want::Nothing => StepOutput::Nothing,
                    Want::Argmax => StepOutput::Argmax(top_k(row, 1).first().map_or(0, |c| c.0)),
                    Want::TopK(k) => StepOutput::TopK(top_k(row, k)),
                    Want::Logits => StepOutput::Logits(row.to_vec()),
                };
                match (s.want, s.out_rows) {
                    (Want::Nothing, _) => StepOutput::Nothing,
                    (_, 1) => one(&rows),
                    _ => StepOutput::Rows(rows.chunks(self.model.cfg.vocab).map(one).collect()),
                }
            })
            .collect())
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), EngineError> {
        let c = &self.model.cfg;
        let size = c.n_kv_heads * self.opts.block_len * c.head_dim;
        for &(s, d) in pairs {
            if s.max(d) as usize >= self.opts.n_blocks {
                return Err(EngineError::Usage(format!("a copy of block {s} into {d} in a cache of {} blocks", self.opts.n_blocks)));
            }
            let (s, d) = (s as usize * size, d as usize * size);
            for layer in self.keys.iter_mut().chain(self.values.iter_mut()) {
                layer.copy_within(s..s + size, d);
            }
        }
        Ok(())
    }

    fn last_step_counters(&self) -> StepCounters {
        StepCounters::default()
    }
}
