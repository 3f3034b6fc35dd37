//! Uploads, readback, and the implicit stream that eager tensor ops record into.
//!
//! Eager ops append to one recording per context; it is submitted when data is read back, on
//! [`GpuContext::flush`], or every [`STREAM_FLUSH_DISPATCHES`] dispatches. So a chain of eager ops
//! costs one submit, not one per op.

use std::sync::Arc;
use std::sync::mpsc;

use super::context::GpuContext;
use super::pool::{BufferKind, GpuBuffer};
use super::recorder::Recorder;
use super::submission::Submission;
use crate::error::{NumrError, Result};

/// The implicit stream is submitted after this many recorded dispatches.
pub const STREAM_FLUSH_DISPATCHES: usize = 1024;

/// Maps `buffer[offset..offset+size]` for reading, waits for `submission` (the one that wrote the
/// buffer; later work is not waited for), and passes the bytes to `f`.
pub(crate) fn map_read<T>(ctx: &GpuContext, buffer: &wgpu::Buffer, offset: u64, size: u64, submission: &Submission, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
    let (tx, rx) = mpsc::channel();
    let slice = buffer.slice(offset..offset + size);
    slice.map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    submission.wait()?;
    let r = match rx.try_recv() {
        Ok(r) => r,
        Err(_) => {
            ctx.wait_idle()?;
            rx.recv().map_err(|e| NumrError::Map(e.to_string()))?
        }
    };
    r.map_err(|e| NumrError::Map(e.to_string()))?;
    let out = {
        let view = slice.get_mapped_range().map_err(|e| NumrError::Map(e.to_string()))?;
        f(&view)
    };
    buffer.unmap();
    Ok(out)
}

impl GpuContext {
    /// Records into the implicit stream.
    pub fn with_stream<T>(&self, f: impl FnOnce(&mut Recorder) -> Result<T>) -> Result<T> {
        let mut slot = self.inner.stream.lock().unwrap_or_else(|p| p.into_inner());
        let mut rec = Recorder { ctx: self.clone(), rec: slot.take().unwrap_or_default(), is_stream: true };
        let out = f(&mut rec);
        let full = rec.dispatch_count() >= STREAM_FLUSH_DISPATCHES;
        *slot = Some(std::mem::take(&mut rec.rec));
        drop(slot);
        if full {
            self.flush()?;
        }
        out
    }

    /// Submits the implicit stream (if anything is recorded). Does not wait; the returned
    /// [`Submission`] does. Taking the stream and submitting it happen under the context's submit
    /// lock, so work another thread recorded into the stream is queued before anything that
    /// thread submits or reads back after it.
    pub fn flush(&self) -> Result<Submission> {
        let guard = self.inner.submit_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.flush_locked(&guard)
    }

    /// [`Self::flush`] with the submit lock held by the caller.
    pub(crate) fn flush_locked(&self, held: &std::sync::MutexGuard<'_, ()>) -> Result<Submission> {
        let taken = self.inner.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        match taken {
            Some(rec) => Recorder { ctx: self.clone(), rec, is_stream: true }.submit_locked(None, held),
            None => Ok(Submission::done(self)),
        }
    }

    /// Submits the implicit stream and waits for the GPU to finish.
    pub fn sync(&self) -> Result<()> {
        self.flush()?;
        self.wait_idle()
    }

    /// Dispatches recorded in the implicit stream and not yet submitted.
    pub fn pending_dispatches(&self) -> usize {
        let slot = self.inner.stream.lock().unwrap_or_else(|p| p.into_inner());
        let rec = slot.as_ref();
        rec.map(Recorder::count_of).unwrap_or(0)
    }

    /// Copies `data` into a new storage buffer.
    pub fn upload(&self, data: &[u8]) -> Result<Arc<GpuBuffer>> {
        let buf = self.alloc(data.len() as u64, BufferKind::Storage)?;
        self.write(&buf, 0, data)?;
        Ok(buf)
    }

    /// Writes `data` into `buf` at `offset` (a multiple of 4). Flushes the implicit stream first,
    /// so ops recorded earlier see the old contents and ops recorded later see the new.
    pub fn write(&self, buf: &Arc<GpuBuffer>, offset: u64, data: &[u8]) -> Result<()> {
        if !offset.is_multiple_of(4) || offset.saturating_add(data.len() as u64) > buf.capacity() {
            return Err(NumrError::Validation {
                context: "writing a buffer".into(),
                message: format!("{} bytes at offset {offset} do not fit {buf:?} or are misaligned", data.len()),
            });
        }
        // The write is queued after the stream's pending work, under the same lock.
        let guard = self.inner.submit_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.flush_locked(&guard)?;
        let whole = data.len() / 4 * 4;
        self.scoped("uploading data", || {
            if whole > 0 {
                self.inner.queue.write_buffer(buf.raw(), offset, &data[..whole]);
            }
            if whole < data.len() {
                let mut tail = [0u8; 4];
                tail[..data.len() - whole].copy_from_slice(&data[whole..]);
                self.inner.queue.write_buffer(buf.raw(), offset + whole as u64, &tail);
            }
        })
    }

    /// Reads `len` bytes at byte `offset` of `buf`, after all work recorded so far.
    pub fn read_bytes(&self, buf: &Arc<GpuBuffer>, offset: u64, len: u64) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        if offset.saturating_add(len) > buf.capacity() {
            return Err(NumrError::Validation {
                context: "reading a buffer back".into(),
                message: format!("{len} bytes at {offset} past the buffer's {} bytes", buf.capacity()),
            });
        }
        let start = offset / 4 * 4;
        let end = (offset + len).div_ceil(4) * 4;
        let staging = self.alloc(end - start, BufferKind::Readback)?;
        self.with_stream(|rec| rec.copy(buf, start, &staging, 0, end - start))?;
        let submission = self.flush()?;
        let skip = (offset - start) as usize;
        map_read(self, staging.raw(), 0, end - start, &submission, |b| b[skip..skip + len as usize].to_vec())
    }
}
