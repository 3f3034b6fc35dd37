//! The paged KV cache: K/V memory as a pool of fixed-size blocks shared by many sequences, each
//! sequence owning a block table, and the kernels that write and attend through those tables.
//!
//! # Storage
//! A block holds `block_len` positions of every KV head of one layer, laid out
//! `[kv_head][block_len][row]` (rows as [`crate::kv_cache`] stores them: f16, or q8_0 padded to
//! 9 words per 32 values). Blocks are numbered `0 .. n_blocks` for the whole cache; each layer
//! has the same number of blocks, and block `b` of a sequence's table names its rows in every
//! layer. A layer's blocks live in one or more buffers ([`PagedKvBuffer`]), each at most one
//! binding (128 MiB on lavapipe, 2 GiB or more on Vulkan): block `b` is block
//! `b - first_block` of the buffer whose range holds it. So a cache of any size, and a sequence
//! longer than one binding, both work: the kernels run one dispatch per buffer and each attends or
//! writes only the positions whose block lives in its buffer.
//!
//! # Ownership
//! [`BlockAllocator`] hands out block numbers on the CPU (a free list; freed blocks are reused
//! first) with a reference count per block, so that sequences can share a prefix's blocks.
//! [`BlockTable`] is one sequence's list of blocks and its length. Neither touches the GPU: a
//! step's tables go up in a [`PagedBatch`] (one upload per step) that the plans read.
//!
//! # A batched step
//! A step carries `n_tok` tokens from one or more sequences (decode rows and prefill chunks
//! mixed). Token `t` has a table offset (where its sequence's block table starts in the batch's
//! table array) and a position: the KV write stores its K/V rows at that position, and attention
//! attends its queries over keys `0 ..= position` of its sequence (inside the window, if any).
//! Plans are built once for the most tokens and table entries a step may carry; recording a step
//! allocates nothing.
//!
//! # Head sizes and kernels
//! Every head size that is a multiple of 8 from 8 to 256 (a multiple of 32 for q8_0), and any
//! number of query heads per KV head. Attention runs the subgroup flash-decoding kernel of
//! [`crate::attention`] (its paged variant) for head sizes 64, 128 and 256 with up to 16 query
//! heads per KV head where the adapter has subgroups of at least 8, and a portable kernel
//! (workgroup memory, no subgroups) for every other shape and adapter.
//!
//! # Prefix sharing
//! [`PrefixCache`] lets sequences with a common token prefix share its full blocks (see its
//! module docs in `prefix.rs`).

use std::fmt;
use std::sync::Arc;

use numr::gpu::{BufferKind, GpuBuffer, GpuContext};

use crate::kv_cache::KvDtype;
use crate::ops_common::{OpsError, Result, bad};

mod attention;
mod attention_plan;
mod batch;
mod blocks;
mod prefix;
mod reference;
mod write;

pub use attention::{PAGED_ATTN_WG, PagedAttn};
pub use attention_plan::{PagedAttnPlan, Splits, auto_splits};
pub use batch::{BatchSeq, PagedBatch};
pub use blocks::{BlockAllocator, BlockTable};
pub use prefix::{BlockCopy, PrefixCache, PrefixStats, block_hash};
pub use reference::paged_attention_ref;
pub use write::{PagedKvWrite, PagedKvWritePlan, PagedRowsLayout};

/// Positions per block unless configured otherwise.
pub const DEFAULT_BLOCK_LEN: usize = 16;

/// Shape and storage of a paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedKvConfig {
    /// Layers (each with its own buffers).
    pub n_layers: usize,
    /// KV heads per layer.
    pub n_kv_heads: usize,
    /// Values per head row (see [`PagedKvConfig::supports_head_dim`]).
    pub head_dim: usize,
    /// Positions per block.
    pub block_len: usize,
    /// Blocks in the whole cache (every layer has this many).
    pub n_blocks: usize,
    /// Storage type of the rows.
    pub dtype: KvDtype,
    /// Largest buffer (defaults to the adapter's binding limit); tests lower it to spread a layer
    /// over several buffers.
    pub max_buffer_bytes: Option<u64>,
}

impl PagedKvConfig {
    /// Whether the paged kernels take `head_dim` for `dtype`: a multiple of 8 from 8 to 256 (f16),
    /// a multiple of 32 up to 256 (q8_0).
    pub fn supports_head_dim(dtype: KvDtype, head_dim: usize) -> bool {
        (8..=256).contains(&head_dim)
            && match dtype {
                KvDtype::F16 => head_dim.is_multiple_of(8),
                KvDtype::Q8_0 => head_dim.is_multiple_of(32),
            }
    }

    /// Bytes of one block of one layer, K or V.
    pub fn block_bytes(&self) -> u64 {
        (self.n_kv_heads * self.block_len * self.dtype.row_words(self.head_dim) * 4) as u64
    }

    /// Bytes of one block in every layer, K and V: what one block of a sequence costs.
    pub fn bytes_per_block(&self) -> u64 {
        2 * self.n_layers as u64 * self.block_bytes()
    }

    /// The config with as many blocks as `budget` bytes hold (at least one).
    pub fn with_budget(mut self, budget: u64) -> PagedKvConfig {
        self.n_blocks = (budget / self.bytes_per_block().max(1)).max(1) as usize;
        self
    }
}

impl fmt::Display for PagedKvConfig {
    /// In words, for error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self;
        write!(
            f,
            "{} layers of {} KV heads of head size {}, {} blocks of {} positions, {}",
            c.n_layers, c.n_kv_heads, c.head_dim, c.n_blocks, c.block_len, c.dtype
        )
    }
}

/// One buffer of one layer: blocks `first_block .. first_block + n_blocks`.
#[derive(Clone, Debug)]
pub struct PagedKvBuffer {
    /// The first block the buffer holds.
    pub first_block: usize,
    /// Blocks it holds.
    pub n_blocks: usize,
    /// Keys: `[block][kv_head][block_len][row_words]` u32 words.
    pub k: Arc<GpuBuffer>,
    /// Values, laid out as `k`.
    pub v: Arc<GpuBuffer>,
}

/// The GPU memory of a paged KV cache (see the [module docs](self)).
#[derive(Debug)]
pub struct PagedKvCache {
    cfg: PagedKvConfig,
    layers: Vec<Vec<PagedKvBuffer>>,
    /// One block of K and one of V: a copy within one buffer goes through it (a GPU copy's
    /// source and destination must be different buffers).
    scratch: Arc<GpuBuffer>,
}

impl PagedKvCache {
    /// Allocates the cache (zeroed). Typed errors for a head size the kernels do not take, an
    /// empty shape, a block larger than one binding, and GPU memory the adapter cannot give.
    pub fn new(ctx: &GpuContext, cfg: PagedKvConfig) -> Result<PagedKvCache> {
        if !PagedKvConfig::supports_head_dim(cfg.dtype, cfg.head_dim) {
            let sizes = match cfg.dtype {
                KvDtype::F16 => "a multiple of 8 from 8 to 256",
                KvDtype::Q8_0 => "a multiple of 32 up to 256",
            };
            return Err(OpsError::Unsupported { what: "paged KV cache head size", reason: format!("head size {} as {} ({sizes})", cfg.head_dim, cfg.dtype) });
        }
        if cfg.n_kv_heads == 0 || cfg.block_len == 0 || cfg.n_blocks == 0 || cfg.n_layers == 0 {
            return Err(OpsError::Unsupported { what: "paged KV cache shape", reason: format!("{cfg} (every count must be positive)") });
        }
        // Kernels address blocks, positions and words with 32 bits.
        let words = (cfg.n_blocks as u64).saturating_mul(cfg.block_bytes() / 4);
        if u32::try_from(cfg.n_blocks.saturating_mul(cfg.block_len)).is_err() || words > u64::from(u32::MAX) * 64 {
            return Err(OpsError::Unsupported { what: "paged KV cache size", reason: format!("{cfg} does not fit 32-bit addressing") });
        }
        let limits = &ctx.capabilities().limits;
        let max = cfg.max_buffer_bytes.unwrap_or(u64::MAX).min(limits.max_storage_buffer_binding_size).min(limits.max_buffer_size);
        // Word addresses inside one buffer stay below 2^32.
        let max = max.min(u64::from(u32::MAX) * 4);
        let per_buf = (max / cfg.block_bytes()) as usize;
        if per_buf == 0 {
            return Err(OpsError::Unsupported {
                what: "paged KV block",
                reason: format!("one block needs {} bytes, a binding holds {max}", cfg.block_bytes()),
            });
        }
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for _ in 0..cfg.n_layers {
            let mut bufs = Vec::new();
            let mut first = 0;
            while first < cfg.n_blocks {
                let n = per_buf.min(cfg.n_blocks - first);
                let bytes = n as u64 * cfg.block_bytes();
                let (k, v) = (ctx.alloc(bytes, BufferKind::Storage)?, ctx.alloc(bytes, BufferKind::Storage)?);
                ctx.with_stream(|rec| {
                    rec.clear(&k)?;
                    rec.clear(&v)
                })?;
                bufs.push(PagedKvBuffer { first_block: first, n_blocks: n, k, v });
                first += n;
            }
            layers.push(bufs);
        }
        let scratch = ctx.alloc(2 * cfg.block_bytes(), BufferKind::Storage)?;
        Ok(PagedKvCache { cfg, layers, scratch })
    }

    /// The shape and storage the cache was made with.
    pub fn config(&self) -> &PagedKvConfig {
        &self.cfg
    }

    /// The buffers of `layer`, in block order. [`OpsError::BadArgs`] for a layer the cache lacks.
    pub fn buffers(&self, layer: usize) -> Result<&[PagedKvBuffer]> {
        self.layers
            .get(layer)
            .map(|v| v.as_slice())
            .ok_or_else(|| bad("PagedKvCache::buffers", format!("layer {layer} of a cache of {} layers", self.cfg.n_layers)))
    }

    /// Records copies of every layer's K and V rows of block `src` into block `dst` (a prefix
    /// cache's copy on write, [`BlockCopy`]), through a scratch block (the two usually share a
    /// buffer). Typed error for a block past the cache.
    pub fn copy_block(&self, rec: &mut numr::gpu::Recorder, src: u32, dst: u32) -> Result<()> {
        let c = &self.cfg;
        let find = |bufs: &[PagedKvBuffer], b: u32| {
            let b = b as usize;
            bufs.iter()
                .find(|x| (x.first_block..x.first_block + x.n_blocks).contains(&b))
                .map(|x| (x.clone(), (b - x.first_block) as u64 * c.block_bytes()))
                .ok_or_else(|| bad("PagedKvCache::copy_block", format!("block {b} of a cache of {} blocks", c.n_blocks)))
        };
        let bb = c.block_bytes();
        for bufs in &self.layers {
            let ((s, so), (d, doff)) = (find(bufs, src)?, find(bufs, dst)?);
            rec.copy(&s.k, so, &self.scratch, 0, bb)?;
            rec.copy(&s.v, so, &self.scratch, bb, bb)?;
            rec.copy(&self.scratch, 0, &d.k, doff, bb)?;
            rec.copy(&self.scratch, bb, &d.v, doff, bb)?;
        }
        Ok(())
    }

    /// Reads back positions `0 .. len` of a sequence's K and V in `layer` as f32
    /// `[kv_head][len][head_dim]` (tests and debugging). Typed errors for a table shorter than
    /// `len` or naming a block past the cache.
    pub fn read_sequence(&self, ctx: &GpuContext, layer: usize, table: &BlockTable, len: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let c = &self.cfg;
        let (hd, rw, bl) = (c.head_dim, c.dtype.row_words(c.head_dim), c.block_len);
        if table.blocks().len() * bl < len {
            return Err(bad("PagedKvCache::read_sequence", format!("{} blocks of {bl} positions hold fewer than {len}", table.blocks().len())));
        }
        let bufs = self.buffers(layer)?;
        let mut k = vec![0.0; c.n_kv_heads * len * hd];
        let mut v = k.clone();
        for (bi, &b) in table.blocks().iter().enumerate().take(len.div_ceil(bl)) {
            let b = b as usize;
            let buf = bufs
                .iter()
                .find(|x| (x.first_block..x.first_block + x.n_blocks).contains(&b))
                .ok_or_else(|| bad("PagedKvCache::read_sequence", format!("block {b} of a cache of {} blocks", c.n_blocks)))?;
            let off = (b - buf.first_block) as u64 * c.block_bytes();
            let kb = ctx.read_bytes(&buf.k, off, c.block_bytes())?;
            let vb = ctx.read_bytes(&buf.v, off, c.block_bytes())?;
            let (kw, vw): (&[u32], &[u32]) = (bytemuck::cast_slice(&kb), bytemuck::cast_slice(&vb));
            for h in 0..c.n_kv_heads {
                for i in 0..bl {
                    let pos = bi * bl + i;
                    if pos >= len {
                        break;
                    }
                    let w = (h * bl + i) * rw;
                    let o = (h * len + pos) * hd;
                    k[o..o + hd].copy_from_slice(&c.dtype.decode_row(&kw[w..w + rw], hd)?);
                    v[o..o + hd].copy_from_slice(&c.dtype.decode_row(&vw[w..w + rw], hd)?);
                }
            }
        }
        Ok((k, v))
    }
}
