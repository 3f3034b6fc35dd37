//! [`PagedBatch`]: the GPU side of one step's sequences (each token's table offset and position,
//! and the block tables), uploaded once per step and read by every layer's plans.

use std::sync::{Arc, Mutex};

use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, StepValues};

use super::BlockTable;
use crate::ops_common::{Result, bad};

/// One sequence's part of a step: `n_tok` tokens at positions `pos .. pos + n_tok` (a decode row
/// is one token; a prefill chunk more). Its table must already hold those positions.
#[derive(Clone, Copy, Debug)]
pub struct BatchSeq<'a> {
    /// The sequence's blocks.
    pub table: &'a BlockTable,
    /// Position of its first token in this step.
    pub pos: usize,
    /// Its tokens in this step.
    pub n_tok: usize,
}

/// Per-step inputs of the paged plans, in GPU buffers made once: `tok[2t] = table offset`,
/// `tok[2t + 1] = position` for token `t`; the sequences' block tables one after another; and the
/// positions alone (`positions[t]`, for [`crate::rope::RopePositions::Buffer`] with
/// `step.token = 0`).
/// Tokens are numbered in the order the sequences are given, each sequence's in position order.
#[derive(Debug)]
pub struct PagedBatch {
    tok: Arc<GpuBuffer>,
    tables: Arc<GpuBuffer>,
    positions: Arc<GpuBuffer>,
    max_tokens: usize,
    max_entries: usize,
    block_len: usize,
    /// Host staging, reused from step to step.
    scratch: Mutex<(Vec<u32>, Vec<u32>)>,
}

impl PagedBatch {
    /// Buffers for steps of at most `max_tokens` tokens whose sequences' tables hold at most
    /// `max_entries` blocks together, for a cache of `block_len` positions per block.
    pub fn new(ctx: &GpuContext, max_tokens: usize, max_entries: usize, block_len: usize) -> Result<PagedBatch> {
        if max_tokens == 0 || max_entries == 0 || block_len == 0 {
            return Err(bad("PagedBatch::new", "tokens, table entries and block length must be positive"));
        }
        let tok = ctx.alloc((max_tokens * 8) as u64, BufferKind::Storage)?;
        let tables = ctx.alloc((max_entries * 4) as u64, BufferKind::Storage)?;
        let positions = ctx.alloc((max_tokens * 4) as u64, BufferKind::Storage)?;
        ctx.with_stream(|rec| {
            rec.clear(&tok)?;
            rec.clear(&tables)?;
            rec.clear(&positions)
        })?;
        let scratch = Mutex::new((Vec::with_capacity(max_tokens * 2), Vec::with_capacity(max_entries.max(max_tokens))));
        Ok(PagedBatch { tok, tables, positions, max_tokens, max_entries, block_len, scratch })
    }

    /// The most tokens a step carries.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The per-token words (`[table offset, position]` per token).
    pub fn tok_binding(&self) -> Binding {
        Binding::whole(&self.tok)
    }

    /// The block tables.
    pub fn table_binding(&self) -> Binding {
        Binding::whole(&self.tables)
    }

    /// Each token's position (u32), for RoPE.
    pub fn positions_binding(&self) -> Binding {
        Binding::whole(&self.positions)
    }

    /// Uploads a step's sequences and returns the step values to record the plans with
    /// ([`StepValues::batch`]: the step's tokens and its longest sequence's KV length). Typed errors for a step over the buffers' sizes, a sequence with no tokens, or a
    /// table that does not hold a sequence's positions. Ordered after everything recorded or
    /// submitted before (a step in flight still reads the old contents).
    pub fn set(&self, ctx: &GpuContext, seqs: &[BatchSeq<'_>]) -> Result<StepValues> {
        const OP: &str = "PagedBatch::set";
        let mut guard = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let (tok, tables) = &mut *guard;
        tok.clear();
        tables.clear();
        let mut kv_max = 0;
        for (i, s) in seqs.iter().enumerate() {
            let end = s.pos.checked_add(s.n_tok).ok_or_else(|| bad(OP, "positions overflow"))?;
            if s.n_tok == 0 || end > s.table.blocks().len() * self.block_len {
                return Err(bad(
                    OP,
                    format!("sequence {i}: tokens at {}..{end} with {} blocks of {} positions", s.pos, s.table.blocks().len(), self.block_len),
                ));
            }
            let off = u32::try_from(tables.len()).map_err(|_| bad(OP, "table offset over 32 bits"))?;
            kv_max = kv_max.max(end);
            let used = end.div_ceil(self.block_len);
            if tables.len() + used > self.max_entries || tok.len() / 2 + s.n_tok > self.max_tokens {
                return Err(bad(OP, format!("the step needs more than {} tokens or {} table entries (the batch's size)", self.max_tokens, self.max_entries)));
            }
            tables.extend_from_slice(&s.table.blocks()[..used]);
            for p in s.pos..end {
                tok.push(off);
                tok.push(u32::try_from(p).map_err(|_| bad(OP, "position over 32 bits"))?);
            }
        }
        if tok.is_empty() {
            return Err(bad(OP, "a step of no tokens"));
        }
        ctx.write(&self.tok, 0, bytemuck::cast_slice(tok))?;
        ctx.write(&self.tables, 0, bytemuck::cast_slice(tables))?;
        // The positions alone, staged in the table scratch (no longer needed).
        tables.clear();
        tables.extend(tok.iter().skip(1).step_by(2));
        ctx.write(&self.positions, 0, bytemuck::cast_slice(tables))?;
        let n = u32::try_from(tok.len() / 2).map_err(|_| bad(OP, "tokens over 32 bits"))?;
        Ok(StepValues::batch(n, u32::try_from(kv_max).map_err(|_| bad(OP, "positions over 32 bits"))?))
    }
}
