//! The KV cache: f16 (default) or q8_0 storage, one set of buffers per layer, laid out
//! `[kv_head][pos][row]` so that decode reads each head's keys as one contiguous run.
//!
//! # Storage of one row (one head's `head_dim` values at one position)
//! - [`KvDtype::F16`]: `head_dim / 2` u32 words, element `2w` in the low half of word `w`.
//! - [`KvDtype::Q8_0`]: `head_dim / 32` blocks of 9 words: 8 words of int8 quants (element `4j+i`
//!   in byte `i` of word `j`, as ggml's Q8_0 `qs`) and a word whose low half is the f16 scale `d`
//!   (value = `q * d`; `d = amax / 127`, `q = round(x / d)` with ties away from zero, exactly as
//!   llama.cpp's `quantize_row_q8_0`). 36 bytes per 32 values instead of ggml's 34, so every load is
//!   a whole word.
//!
//! # Segments
//! A layer's positions are split into segments of `seg_len` positions, each with its own K and V
//! buffer (`[kv_head][seg_len][row]`), so that a cache larger than one binding (128 MiB on
//! lavapipe, 2 GiB on Vulkan) still works: writes go to the segment holding the slot and the
//! attention kernels run per segment (flash-decoding splits merge across segments).
//!
//! # Context check
//! [`KvCache::reserve`] returns [`OpsError::ContextOverflow`] before anything is recorded when an
//! append would pass the capacity; no kernel ever writes out of bounds (the write kernel also
//! drops slots outside its segment).
//!
//! # Writing
//! The fused QK-norm + RoPE + KV write ([`crate::rope::QkvRopePlan`]) stores K/V rows it
//! produces; [`KvWritePlan`] stores rows produced elsewhere (no rotation, no norm). Both write
//! slot `step.pos + t` for token `t` of a step.

use std::fmt;
use std::sync::Arc;

use numr::gpu::{BufferKind, GpuBuffer, GpuContext};

use crate::ops_common::{OpsError, Result, bad, round_f16};

mod write;

pub use write::KvWritePlan;

/// Storage type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// f16 values, two per u32 word (the default).
    F16,
    /// ggml's Q8_0 quantization per 32 values, padded to 9 words per block (see the module docs).
    Q8_0,
}

impl KvDtype {
    /// u32 words per row of `head_dim` values.
    pub fn row_words(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F16 => head_dim / 2,
            KvDtype::Q8_0 => head_dim / 32 * 9,
        }
    }

    /// Whether `head_dim` is storable (even for f16, a multiple of 32 for q8_0; at most 256).
    pub fn supports(self, head_dim: usize) -> bool {
        head_dim <= 256
            && match self {
                KvDtype::F16 => head_dim.is_multiple_of(2),
                KvDtype::Q8_0 => head_dim.is_multiple_of(32),
            }
    }

    /// CPU reference: the values a row reads back as after storage.
    pub fn round_row(self, row: &[f32]) -> Vec<f32> {
        match self {
            KvDtype::F16 => row.iter().map(|&x| round_f16(x)).collect(),
            KvDtype::Q8_0 => row
                .chunks(32)
                .flat_map(|b| {
                    let amax = b.iter().fold(0.0f32, |m, &x| m.max(x.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    let dh = round_f16(d);
                    b.iter().map(move |&x| (x * id).round().clamp(-127.0, 127.0) * dh).collect::<Vec<_>>()
                })
                .collect(),
        }
    }

    /// CPU decoder of one stored row (mirrors the WGSL loaders). [`OpsError::BadArgs`] when
    /// `head_dim` is not storable or `words` is shorter than [`Self::row_words`].
    pub fn decode_row(self, words: &[u32], head_dim: usize) -> Result<Vec<f32>> {
        if !self.supports(head_dim) || words.len() < self.row_words(head_dim) {
            return Err(bad("KvDtype::decode_row", format!("{} words for a {self} row of {head_dim}", words.len())));
        }
        Ok(match self {
            KvDtype::F16 => (0..head_dim).map(|e| half::f16::from_bits((words[e / 2] >> (16 * (e % 2))) as u16).to_f32()).collect(),
            KvDtype::Q8_0 => (0..head_dim)
                .map(|e| {
                    let blk = &words[e / 32 * 9..][..9];
                    let q = ((blk[(e % 32) / 4] >> (8 * (e % 4))) & 0xFF) as u8 as i8;
                    q as f32 * half::f16::from_bits(blk[8] as u16).to_f32()
                })
                .collect(),
        })
    }

    /// WGSL `fn store_<name>(base: u32, lidx: u32)`: stores `row[0..hd]` (a `var<workgroup>`
    /// f32 array) at word `base` of binding `name`, the work spread over `wg` invocations.
    pub fn store_fn(self, name: &str, wg: u32) -> String {
        match self {
            KvDtype::F16 => format!(
                "fn store_{name}(base: u32, lidx: u32) {{\n    for (var w = lidx; w < p.hd / 2u; w += {wg}u) {{ {name}[base + w] = pack2x16float(vec2<f32>(row[2u * w], row[2u * w + 1u])); }}\n}}\n"
            ),
            KvDtype::Q8_0 => format!(
                "fn round_away_{name}(t: f32) -> f32 {{
    let tr = trunc(t);
    return select(round(t), tr + sign(t), abs(t - tr) == 0.5);
}}
fn store_{name}(base: u32, lidx: u32) {{
    for (var b = lidx; b < p.hd / 32u; b += {wg}u) {{
        var amax = 0.0;
        for (var j = 0u; j < 32u; j++) {{ amax = max(amax, abs(row[32u * b + j])); }}
        let d = amax / 127.0;
        let id = select(0.0, 1.0 / d, d != 0.0);
        for (var j = 0u; j < 8u; j++) {{
            var word = 0u;
            for (var i = 0u; i < 4u; i++) {{
                let q = i32(clamp(round_away_{name}(row[32u * b + 4u * j + i] * id), -127.0, 127.0));
                word |= (bitcast<u32>(q) & 0xffu) << (8u * i);
            }}
            {name}[base + 9u * b + j] = word;
        }}
        {name}[base + 9u * b + 8u] = pack2x16float(vec2<f32>(d, 0.0)) & 0xffffu;
    }}
}}
"
            ),
        }
    }
}

impl fmt::Display for KvDtype {
    /// `f16` or `q8_0`, as llama.cpp names the cache types.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
        })
    }
}

/// Shape and storage of a KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Layers (each with its own buffers).
    pub n_layers: usize,
    /// KV heads per layer.
    pub n_kv_heads: usize,
    /// Values per head row (see [`KvDtype::supports`]).
    pub head_dim: usize,
    /// Positions per sequence.
    pub capacity: usize,
    /// Storage type of the rows.
    pub dtype: KvDtype,
    /// Largest buffer of one segment (defaults to the adapter's binding limit); tests lower it
    /// to exercise the split path.
    pub max_segment_bytes: Option<u64>,
}

/// One segment of one layer: positions `start .. start + len`.
#[derive(Clone, Debug)]
pub struct KvSegment {
    /// First position of the segment.
    pub start: usize,
    /// Positions in the segment.
    pub len: usize,
    /// Keys: `[kv_head][len][row_words]` u32 words.
    pub k: Arc<GpuBuffer>,
    /// Values, laid out as `k`.
    pub v: Arc<GpuBuffer>,
}

/// A GPU KV cache for one sequence.
#[derive(Debug)]
pub struct KvCache {
    cfg: KvCacheConfig,
    seg_len: usize,
    layers: Vec<Vec<KvSegment>>,
    len: usize,
}

impl fmt::Display for KvCacheConfig {
    /// In words, for error messages: `2 layers of 4 KV heads of head size 80, 64 positions, f16`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self;
        write!(f, "{} layers of {} KV heads of head size {}, {} positions, {}", c.n_layers, c.n_kv_heads, c.head_dim, c.capacity, c.dtype)
    }
}

impl KvCache {
    /// Allocates the cache (zeroed).
    pub fn new(ctx: &GpuContext, cfg: KvCacheConfig) -> Result<KvCache> {
        if !cfg.dtype.supports(cfg.head_dim) {
            let sizes = match cfg.dtype {
                KvDtype::F16 => "even, at most 256",
                KvDtype::Q8_0 => "a multiple of 32, at most 256",
            };
            return Err(OpsError::Unsupported {
                what: "KV cache head size",
                reason: format!("head size {} cannot be stored as {} rows ({sizes})", cfg.head_dim, cfg.dtype),
            });
        }
        if cfg.capacity == 0 || cfg.n_kv_heads == 0 {
            return Err(OpsError::Unsupported { what: "KV cache shape", reason: format!("{cfg} (positions and KV heads must be positive)") });
        }
        let limits = &ctx.capabilities().limits;
        let max = cfg.max_segment_bytes.unwrap_or(u64::MAX).min(limits.max_storage_buffer_binding_size).min(limits.max_buffer_size);
        let pos_bytes = cfg
            .n_kv_heads
            .checked_mul(cfg.dtype.row_words(cfg.head_dim) * 4)
            .and_then(|b| u64::try_from(b).ok())
            .ok_or_else(|| bad("KvCache::new", format!("{} KV heads of head_dim {} overflow", cfg.n_kv_heads, cfg.head_dim)))?;
        // Kernels address positions and rows with 32-bit words.
        if u32::try_from(cfg.capacity).is_err() {
            return Err(OpsError::Unsupported { what: "KV cache capacity", reason: format!("{} positions do not fit 32 bits", cfg.capacity) });
        }
        let seg_len = usize::try_from(max / pos_bytes).unwrap_or(usize::MAX).min(cfg.capacity);
        if seg_len == 0 {
            return Err(OpsError::Unsupported { what: "KV cache segment", reason: format!("one position needs {pos_bytes} bytes, a binding holds {max}") });
        }
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for _ in 0..cfg.n_layers {
            let mut segs = Vec::new();
            let mut start = 0;
            while start < cfg.capacity {
                let len = seg_len.min(cfg.capacity - start);
                let bytes = len as u64 * pos_bytes;
                let (k, v) = (ctx.alloc(bytes, BufferKind::Storage)?, ctx.alloc(bytes, BufferKind::Storage)?);
                ctx.with_stream(|rec| {
                    rec.clear(&k)?;
                    rec.clear(&v)
                })?;
                segs.push(KvSegment { start, len, k, v });
                start += len;
            }
            layers.push(segs);
        }
        Ok(KvCache { cfg, seg_len, layers, len: 0 })
    }

    /// The shape and storage the cache was made with.
    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }
    /// Positions written so far.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when no position has been written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Positions the cache holds at most ([`KvCacheConfig::capacity`]).
    pub fn capacity(&self) -> usize {
        self.cfg.capacity
    }
    /// Positions per segment.
    pub fn segment_len(&self) -> usize {
        self.seg_len
    }
    /// The segments of `layer` (positions `i * segment_len() ..`, the last one shorter).
    /// [`OpsError::BadArgs`] for a layer the cache does not have.
    pub fn segments(&self, layer: usize) -> Result<&[KvSegment]> {
        self.layers
            .get(layer)
            .map(|v| v.as_slice())
            .ok_or_else(|| bad("KvCache::segments", format!("layer {layer} of a cache of {} layers", self.cfg.n_layers)))
    }

    /// Checks that `n` more positions fit and returns the first slot; nothing changes until
    /// [`Self::commit`].
    pub fn reserve(&self, n: usize) -> Result<usize> {
        let needed = self.len + n;
        if needed > self.cfg.capacity {
            return Err(OpsError::ContextOverflow { needed, capacity: self.cfg.capacity });
        }
        Ok(self.len)
    }

    /// Marks `n` reserved positions as written (after every layer's append was recorded).
    pub fn commit(&mut self, n: usize) -> Result<()> {
        self.reserve(n)?;
        self.len += n;
        Ok(())
    }

    /// Drops positions from `len` on (prefix reuse across turns).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Reads back `layer`'s K and V for positions `0..len` as f32 `[kv_head][len][head_dim]`
    /// (tests and debugging).
    pub fn read_layer(&self, ctx: &GpuContext, layer: usize, len: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        if len > self.cfg.capacity {
            return Err(bad("KvCache::read_layer", "past the capacity"));
        }
        let (hd, rw) = (self.cfg.head_dim, self.cfg.dtype.row_words(self.cfg.head_dim));
        let segs = self.segments(layer)?;
        let mut k = vec![0.0; self.cfg.n_kv_heads * len * hd];
        let mut v = k.clone();
        for seg in segs.iter().filter(|s| s.start < len) {
            let kb = ctx.read_bytes(&seg.k, 0, (self.cfg.n_kv_heads * seg.len * rw * 4) as u64)?;
            let vb = ctx.read_bytes(&seg.v, 0, (self.cfg.n_kv_heads * seg.len * rw * 4) as u64)?;
            let (kw, vw): (&[u32], &[u32]) = (bytemuck::cast_slice(&kb), bytemuck::cast_slice(&vb));
            for h in 0..self.cfg.n_kv_heads {
                for pos in seg.start..(seg.start + seg.len).min(len) {
                    let w = (h * seg.len + pos - seg.start) * rw;
                    let o = (h * len + pos) * hd;
                    k[o..o + hd].copy_from_slice(&self.cfg.dtype.decode_row(&kw[w..w + rw], hd)?);
                    v[o..o + hd].copy_from_slice(&self.cfg.dtype.decode_row(&vw[w..w + rw], hd)?);
                }
            }
        }
        Ok((k, v))
    }
}
