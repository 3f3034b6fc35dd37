//! [`BulkUpload`]: many writes to device buffers (a model's weights at load) through a ring of
//! reused staging chunks, submitted in batches while the host goes on.
//!
//! [`GpuContext::write`] goes through wgpu's `Queue::write_buffer`, which copies into a staging
//! buffer made for that one write, and every pending write waits for the next submit. Loading
//! gigabytes that way makes a fresh mapped allocation per matrix (the kernel zeroes and the
//! driver pins each page the first time it is touched), keeps all of them alive until the load
//! submits, and leaves the whole transfer to the first step that waits on the queue.
//!
//! A bulk upload instead copies into the mapped chunks of a [`wgpu::util::StagingBelt`] (in
//! pieces of at most a chunk, so chunks are reused once the GPU has read them), submits every
//! [`BULK_BATCH_BYTES`], keeps at most [`BULK_IN_FLIGHT`] batches outstanding (waiting for the
//! oldest beyond that bounds the staging memory), and [`BulkUpload::finish`] waits for the last
//! one: when it returns the data is on the device.

use std::collections::VecDeque;
use std::num::NonZeroU64;
use std::sync::Arc;

use super::context::GpuContext;
use super::pool::{BufferKind, GpuBuffer};
use super::submission::Submission;
use crate::error::{NumrError, Result};

/// Bytes of one staging chunk (a write larger than this goes in pieces).
pub const BULK_CHUNK_BYTES: u64 = 32 << 20;

/// Bytes written between submits.
pub const BULK_BATCH_BYTES: u64 = 128 << 20;

/// Submitted batches that may be outstanding (about this many batches of staging memory).
pub const BULK_IN_FLIGHT: usize = 2;

/// Writes to device buffers through reused staging chunks ([`GpuContext::bulk_upload`]). Writes
/// are ordered after everything recorded or submitted on the context before the bulk upload
/// began; call [`Self::finish`] before anything reads what it wrote. Dropped unfinished, the
/// writes recorded since the last batch are lost.
pub struct BulkUpload {
    ctx: GpuContext,
    /// Staging chunk and batch sizes in bytes.
    chunk: u64,
    batch: u64,
    belt: wgpu::util::StagingBelt,
    encoder: Option<wgpu::CommandEncoder>,
    /// Bytes recorded into `encoder`.
    pending: u64,
    in_flight: VecDeque<Submission>,
    /// Bytes written in all.
    total: u64,
}

impl GpuContext {
    /// Starts a bulk upload (many writes, one staging ring; see [`BulkUpload`]). Submits the
    /// implicit stream first, so ops recorded before see the old contents.
    pub fn bulk_upload(&self) -> Result<BulkUpload> {
        self.bulk_upload_sized(BULK_CHUNK_BYTES, BULK_BATCH_BYTES)
    }

    /// [`Self::bulk_upload`] with staging chunks of `chunk` bytes (a multiple of 4, at least 4)
    /// and a submit every `batch` bytes (tests use small ones to exercise the ring).
    pub fn bulk_upload_sized(&self, chunk: u64, batch: u64) -> Result<BulkUpload> {
        if chunk < 4 || !chunk.is_multiple_of(4) {
            return Err(NumrError::Validation { context: "a bulk upload".into(), message: format!("staging chunks of {chunk} bytes (a multiple of 4)") });
        }
        self.flush()?;
        Ok(BulkUpload {
            ctx: self.clone(),
            chunk,
            batch,
            belt: wgpu::util::StagingBelt::new(self.inner.device.clone(), chunk),
            encoder: None,
            pending: 0,
            in_flight: VecDeque::new(),
            total: 0,
        })
    }
}

impl BulkUpload {
    /// Copies `data` into a new storage buffer ([`GpuContext::upload`] through the ring).
    pub fn upload(&mut self, data: &[u8]) -> Result<Arc<GpuBuffer>> {
        let buf = self.ctx.alloc(data.len() as u64, BufferKind::Storage)?;
        self.write(&buf, 0, data)?;
        Ok(buf)
    }

    /// Writes `data` into `buf` at `offset` (a multiple of 4; a length that is not is padded
    /// with zeros to the next word, as [`GpuContext::write`] does).
    pub fn write(&mut self, buf: &Arc<GpuBuffer>, offset: u64, data: &[u8]) -> Result<()> {
        if !offset.is_multiple_of(4) || offset.saturating_add(data.len().next_multiple_of(4) as u64) > buf.capacity() {
            return Err(NumrError::Validation {
                context: "writing a buffer".into(),
                message: format!("{} bytes at offset {offset} do not fit {buf:?} or are misaligned", data.len()),
            });
        }
        for (i, piece) in data.chunks(self.chunk as usize).enumerate() {
            let at = offset + i as u64 * self.chunk;
            let size = piece.len().next_multiple_of(4);
            let Some(n) = NonZeroU64::new(size as u64) else { continue };
            let device = &self.ctx.inner.device;
            let encoder = self.encoder.get_or_insert_with(|| device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("bulk upload") }));
            let (belt, ctx) = (&mut self.belt, &self.ctx);
            ctx.scoped("uploading data", || {
                let mut view = belt.write_buffer(encoder, buf.raw(), at, n);
                view.slice(..piece.len()).copy_from_slice(piece);
                if size > piece.len() {
                    view.slice(piece.len()..).copy_from_slice(&[0u8; 3][..size - piece.len()]);
                }
            })?;
            self.pending += size as u64;
            self.total += size as u64;
            if self.pending >= self.batch {
                self.submit()?;
            }
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.total
    }

    /// Submits what is recorded and, beyond [`BULK_IN_FLIGHT`] batches, waits for the oldest
    /// (whose chunks then return to the ring).
    fn submit(&mut self) -> Result<()> {
        let Some(encoder) = self.encoder.take() else { return Ok(()) };
        self.belt.finish();
        let ctx = &self.ctx;
        let guard = ctx.inner.submit_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Anything recorded into the implicit stream meanwhile goes first, as with `write`.
        ctx.flush_locked(&guard)?;
        let index = ctx.scoped("submitting an upload", || ctx.inner.queue.submit([encoder.finish()]))?;
        drop(guard);
        self.belt.recall();
        self.pending = 0;
        self.in_flight.push_back(Submission::submitted(ctx, index, &[], Default::default()));
        while self.in_flight.len() > BULK_IN_FLIGHT {
            if let Some(s) = self.in_flight.pop_front() {
                s.wait()?;
            }
        }
        Ok(())
    }

    /// Submits the rest and waits until the GPU has written everything.
    pub fn finish(mut self) -> Result<()> {
        self.submit()?;
        while let Some(s) = self.in_flight.pop_front() {
            s.wait()?;
        }
        Ok(())
    }
}
