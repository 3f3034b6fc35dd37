//! Buffer pool: a dropped [`GpuBuffer`] goes back to a free list keyed by its size class and
//! usage, and the next allocation of that class reuses it instead of creating a buffer.
//!
//! Size classes: powers of two from 256 bytes up to 1 MiB, then eight steps per octave (at most
//! 12.5% slack). Safety of reuse: recordings hold an `Arc` of every buffer they bind until they are
//! submitted, and queue operations run in order, so a buffer returns to the pool only after every
//! use of it has been queued.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::context::GpuContext;
use crate::error::{NumrError, Result};

/// What a buffer is for; each kind has its own free lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferKind {
    /// Storage buffer that kernels read and write, and that copies go to and from.
    Storage,
    /// Host-readable staging buffer for readback.
    Readback,
    /// Uniform buffer (the parameter arena).
    Uniform,
}

impl BufferKind {
    fn usage(self) -> wgpu::BufferUsages {
        use wgpu::BufferUsages as U;
        match self {
            BufferKind::Storage => U::STORAGE | U::COPY_SRC | U::COPY_DST,
            BufferKind::Readback => U::MAP_READ | U::COPY_DST,
            BufferKind::Uniform => U::UNIFORM | U::COPY_DST,
        }
    }
}

/// The size class a request of `bytes` is served from.
pub fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(256);
    if b <= 1 << 20 {
        return b.next_power_of_two();
    }
    let octave = 63 - b.leading_zeros(); // floor(log2 b)
    let step = 1u64 << (octave - 3);
    b.div_ceil(step) * step
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A GPU buffer from the pool. Returned to the pool when dropped.
pub struct GpuBuffer {
    buffer: wgpu::Buffer,
    id: u64,
    len: u64,
    class: u64,
    kind: BufferKind,
    pool: Weak<PoolShared>,
}

impl GpuBuffer {
    /// The underlying wgpu buffer (its size is [`Self::capacity`]).
    pub fn raw(&self) -> &wgpu::Buffer {
        &self.buffer
    }
    /// Id of the underlying wgpu buffer: unique per buffer ever created, and kept when the pool
    /// hands the same buffer out again (so cached bind groups over it stay valid).
    pub fn id(&self) -> u64 {
        self.id
    }
    /// Bytes requested (the underlying buffer may be larger: its size class).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True when zero bytes were requested.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes actually allocated.
    pub fn capacity(&self) -> u64 {
        self.class
    }
}

impl std::fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuBuffer#{}({} bytes)", self.id, self.len)
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(self.kind, self.class, self.buffer.clone(), self.id);
        }
    }
}

/// Counters for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers created on the device (pool misses).
    pub created: u64,
    /// Allocations served from a free buffer of the same kind and size class.
    pub reused: u64,
    /// Bytes of capacity in free buffers the pool currently keeps.
    pub free_bytes: u64,
}

#[derive(Default)]
struct FreeLists {
    lists: HashMap<(BufferKind, u64), Vec<(wgpu::Buffer, u64)>>,
    stats: PoolStats,
}

pub(crate) struct PoolShared {
    free: Mutex<FreeLists>,
    limit: u64,
}

impl PoolShared {
    fn give_back(&self, kind: BufferKind, class: u64, buffer: wgpu::Buffer, id: u64) {
        let mut f = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if f.stats.free_bytes + class > self.limit {
            buffer.destroy();
            return;
        }
        f.stats.free_bytes += class;
        f.lists.entry((kind, class)).or_default().push((buffer, id));
    }
}

pub(crate) struct BufferPool {
    shared: Arc<PoolShared>,
}

impl BufferPool {
    pub(crate) fn new(limit: u64) -> Self {
        BufferPool { shared: Arc::new(PoolShared { free: Mutex::new(FreeLists::default()), limit }) }
    }
}

impl GpuContext {
    /// A buffer of at least `bytes` bytes, reused from the pool when one of its class is free.
    /// Errors with [`NumrError::BufferTooLarge`] over the adapter's `max_buffer_size` and with a
    /// typed out-of-memory or validation error when the driver refuses.
    pub fn alloc(&self, bytes: u64, kind: BufferKind) -> Result<Arc<GpuBuffer>> {
        let limit = self.inner.caps.limits.max_buffer_size;
        if bytes > limit {
            return Err(NumrError::BufferTooLarge { bytes, limit });
        }
        // Near the limit the size class could overshoot it: fall back to the exact (4-aligned) size.
        let mut class = size_class(bytes);
        if class > limit {
            class = bytes.div_ceil(4) * 4;
        }
        let shared = &self.inner.pool.shared;
        {
            let mut f = shared.free.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((buffer, id)) = f.lists.get_mut(&(kind, class)).and_then(|v| v.pop()) {
                f.stats.reused += 1;
                f.stats.free_bytes -= class;
                return Ok(Arc::new(GpuBuffer { buffer, id, len: bytes, class, kind, pool: Arc::downgrade(shared) }));
            }
        }
        let buffer = self.scoped(&format!("allocating a buffer of {class} bytes"), || {
            self.inner.device.create_buffer(&wgpu::BufferDescriptor { label: None, size: class, usage: kind.usage(), mapped_at_creation: false })
        })?;
        shared.free.lock().unwrap_or_else(|p| p.into_inner()).stats.created += 1;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(GpuBuffer { buffer, id, len: bytes, class, kind, pool: Arc::downgrade(shared) }))
    }

    /// The pool's counters so far.
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.shared.free.lock().unwrap_or_else(|p| p.into_inner()).stats
    }

    /// Destroys every free buffer the pool holds.
    pub fn trim_pool(&self) {
        let mut f = self.inner.pool.shared.free.lock().unwrap_or_else(|p| p.into_inner());
        for (_, v) in f.lists.drain() {
            v.iter().for_each(|(b, _)| b.destroy());
        }
        f.stats.free_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn classes() {
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + (1 << 17));
        let b = 100_000_000u64;
        let c = size_class(b);
        assert!(c >= b && (c - b) * 8 <= b, "{c}");
        assert_eq!(c % 4, 0);
    }
}
