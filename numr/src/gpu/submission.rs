//! Submissions and readbacks that wait for one submission, not for everything queued.
//!
//! Every submit returns a [`Submission`]: its wgpu `SubmissionIndex` and a flag the queue sets
//! when the work submitted up to it has finished. [`Submission::wait`] blocks on that index only
//! (`PollType::Wait`), and [`Submission::is_done`] polls without blocking. A [`PendingRead`]
//! (from [`super::Recorder::read`]) waits for the submission that wrote its bytes, so "submit
//! token n+1, then read token n" overlaps instead of serialising. A [`ReadTarget`] is a staging
//! buffer made once, so that a loop reading back every step allocates nothing
//! ([`super::Recorder::read_into`], [`PendingRead::wait_with`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::context::GpuContext;
use super::pool::GpuBuffer;
use crate::error::{NumrError, Result};

/// One queued submission.
#[derive(Clone)]
pub struct Submission {
    ctx: GpuContext,
    index: Option<wgpu::SubmissionIndex>,
    /// Set when the GPU has finished it; `None` for a submission of nothing (done from the
    /// start, and made without allocating).
    done: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for Submission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Submission({:?}, done: {})", self.index, self.finished())
    }
}

/// What a [`PendingRead`] learns at submit time, and its buffer map's outcome.
#[derive(Default)]
pub(crate) struct ReadSlot {
    pub(crate) submission: Option<Submission>,
    /// The map callback's result (set inside a device poll).
    mapped: Option<std::result::Result<(), wgpu::BufferAsyncError>>,
    /// A read of the target is outstanding (recorded, not yet waited for or dropped).
    busy: bool,
}

/// A staging buffer for repeated readbacks of up to its capacity, made once with
/// [`GpuContext::read_target`] and read into with [`super::Recorder::read_into`]. One read of
/// it may be outstanding at a time; a loop with several steps in flight keeps one per step.
pub struct ReadTarget {
    pub(crate) staging: Arc<GpuBuffer>,
    pub(crate) slot: Arc<Mutex<ReadSlot>>,
}

impl std::fmt::Debug for ReadTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadTarget({:?}, busy: {})", self.staging, self.is_busy())
    }
}

impl ReadTarget {
    /// Whether a read of it is outstanding (recorded and not yet waited for or dropped).
    pub fn is_busy(&self) -> bool {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).busy
    }

    /// Bytes it holds.
    pub fn capacity(&self) -> u64 {
        self.staging.capacity()
    }

    /// Marks a read outstanding; errors when one already is.
    pub(crate) fn claim(&self) -> Result<()> {
        let mut s = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if s.busy {
            return Err(NumrError::Validation {
                context: "recording a readback".into(),
                message: "the read target's previous read is still outstanding".into(),
            });
        }
        *s = ReadSlot { submission: None, mapped: None, busy: true };
        Ok(())
    }

    pub(crate) fn release(&self) {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).busy = false;
    }
}

impl GpuContext {
    /// A readback target of at least `bytes` bytes (a pooled staging buffer).
    pub fn read_target(&self, bytes: u64) -> Result<ReadTarget> {
        let staging = self.alloc(bytes.max(4), super::pool::BufferKind::Readback)?;
        Ok(ReadTarget { staging, slot: Arc::new(Mutex::new(ReadSlot::default())) })
    }
}

impl Submission {
    /// A submission of nothing (already complete).
    pub(crate) fn done(ctx: &GpuContext) -> Submission {
        Submission { ctx: ctx.clone(), index: None, done: None }
    }

    /// The flag's value: whether the GPU is known to have finished.
    fn finished(&self) -> bool {
        self.done.as_ref().is_none_or(|d| d.load(Ordering::Acquire))
    }

    /// Tracks `index`, just submitted, and tells the recording's readbacks about it; `done` (a
    /// cleared flag no one else holds) is set when the GPU has finished it.
    pub(crate) fn submitted(ctx: &GpuContext, index: wgpu::SubmissionIndex, reads: &[Arc<Mutex<ReadSlot>>], done: Arc<AtomicBool>) -> Submission {
        let flag = done.clone();
        ctx.inner.queue.on_submitted_work_done(move || flag.store(true, Ordering::Release));
        let s = Submission { ctx: ctx.clone(), index: Some(index), done: Some(done) };
        for r in reads {
            r.lock().unwrap_or_else(|p| p.into_inner()).submission = Some(s.clone());
        }
        s
    }

    /// Whether the GPU has finished this submission (polls the device once, never blocks).
    pub fn is_done(&self) -> Result<bool> {
        if self.finished() {
            return Ok(true);
        }
        self.ctx.poll(wgpu::PollType::Poll)?;
        Ok(self.finished())
    }

    /// Polls the device up to this submission, blocking until it is done, even when it is known
    /// to be done already (so that callbacks registered since, like a buffer map, run).
    fn poll_through(&self) -> Result<()> {
        let kind = match self.index.clone() {
            Some(index) => wgpu::PollType::Wait { submission_index: Some(index), timeout: None },
            None => wgpu::PollType::Poll,
        };
        self.ctx.poll(kind)
    }

    /// Blocks until the GPU has finished this submission (and those before it), not later ones.
    pub fn wait(&self) -> Result<()> {
        if self.index.is_none() || self.finished() {
            return Ok(());
        }
        self.poll_through()
    }
}

/// Bytes being copied back from the GPU (see [`super::Recorder::read`]).
pub struct PendingRead {
    ctx: GpuContext,
    staging: Arc<GpuBuffer>,
    skip: usize,
    len: usize,
    slot: Arc<Mutex<ReadSlot>>,
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingRead({} bytes)", self.len)
    }
}

impl GpuContext {
    /// How many readbacks of this context so far found their map unresolved after polling up to
    /// their own submission, and so waited for everything queued (another thread's poll can
    /// take the callback; a pipelined decode loop that sees this grow serialises host and GPU).
    pub fn read_wait_fallbacks(&self) -> u64 {
        self.inner.read_fallbacks.load(Ordering::Relaxed)
    }
}

impl PendingRead {
    pub(crate) fn new(ctx: GpuContext, staging: Arc<GpuBuffer>, skip: usize, len: usize, slot: Arc<Mutex<ReadSlot>>) -> Self {
        PendingRead { ctx, staging, skip, len, slot }
    }

    fn submission(&self) -> Result<Submission> {
        self.slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .submission
            .clone()
            .ok_or_else(|| NumrError::Validation { context: "reading back".into(), message: "the recording holding this readback was not submitted".into() })
    }

    /// Whether the bytes can be read without blocking (the recording was submitted and the GPU
    /// finished it). Never blocks.
    pub fn is_ready(&self) -> Result<bool> {
        match self.slot.lock().unwrap_or_else(|p| p.into_inner()).submission.as_ref() {
            Some(s) => s.is_done(),
            None => Ok(false),
        }
    }

    /// Waits for the submission that holds the copy (only that one) and returns the bytes.
    pub fn wait(self) -> Result<Vec<u8>> {
        self.wait_with(<[u8]>::to_vec)
    }

    /// The map callback's result, once it has run.
    fn mapped(&self) -> Option<std::result::Result<(), wgpu::BufferAsyncError>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).mapped.take()
    }

    /// Waits for the submission that holds the copy (only that one) and passes the bytes to `f`
    /// (nothing is allocated here: a read of a [`ReadTarget`] whose `f` allocates nothing reads
    /// back without allocating).
    pub fn wait_with<T>(self, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
        let submission = self.submission()?;
        let cap = self.staging.capacity().min((self.skip + self.len).div_ceil(4) as u64 * 4).max(4);
        let slice = self.staging.raw().slice(0..cap);
        let slot = self.slot.clone();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            slot.lock().unwrap_or_else(|p| p.into_inner()).mapped = Some(r);
        });
        // Poll even when the submission is already known to be done: a map requested after its
        // submission finished resolves only in a later poll. Without one, the fallback below
        // waited for everything queued since, so a decode loop that had fallen behind once
        // (token t done before t+1 was submitted) waited for t+1 at every token from then on,
        // and its host and GPU ran one after the other (`numr/tests/gpu_plan.rs`).
        submission.poll_through()?;
        // The map callback runs inside a poll; the one above polled up to our submission.
        let r = match self.mapped() {
            Some(r) => r,
            None => {
                self.ctx.inner.read_fallbacks.fetch_add(1, Ordering::Relaxed);
                self.wait_mapped()?
            }
        };
        r.map_err(|e| NumrError::Map(e.to_string()))?;
        let out = {
            let view = slice.get_mapped_range().map_err(|e| NumrError::Map(e.to_string()))?;
            f(&view[self.skip..self.skip + self.len])
        };
        self.staging.raw().unmap();
        Ok(out)
    }

    /// Waits for everything queued until the map callback has run (another thread's poll may be
    /// running it).
    fn wait_mapped(&self) -> Result<std::result::Result<(), wgpu::BufferAsyncError>> {
        loop {
            self.ctx.wait_idle()?;
            if let Some(r) = self.mapped() {
                return Ok(r);
            }
            std::thread::yield_now();
        }
    }

    /// [`Self::wait`] as little-endian u32 words.
    pub fn wait_u32(self) -> Result<Vec<u32>> {
        let b = self.wait()?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl Drop for PendingRead {
    /// The target may be read into again.
    fn drop(&mut self) {
        self.slot.lock().unwrap_or_else(|p| p.into_inner()).busy = false;
    }
}
