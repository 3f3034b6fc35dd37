//! The recorder: many dispatches (and copies) into one command encoder, as few compute passes as
//! possible (a pass ends only where a copy must run), and one submit.
//!
//! Per-dispatch parameters travel as immediates where the adapter has them, else through one
//! uniform arena per context bound at a dynamic offset. Nothing is created per dispatch: pipelines
//! and bind groups come from the caches (or are built once by the caller with
//! [`GpuContext::bind`]), and the arena buffer and its bind group are reused across submits.
//! A step loop that keeps one recorder ([`Recorder::submit_and_clear`]) and reads back into
//! targets made once ([`Recorder::read_into`]) records and submits without allocating: a
//! dispatch's label is its kernel's shared name, and the recording's lists keep their capacity.

use std::ops::Range;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::submission::{PendingRead, ReadSlot, ReadTarget, Submission};

use super::capabilities::ParamMode;
use super::context::GpuContext;
use super::pipeline::{Binding, BoundGroup, Kernel};
use super::pool::{BufferKind, GpuBuffer};
use super::profiler::{Profile, QueryPlan};
use crate::error::{NumrError, Result};

enum Command {
    Dispatch { pipeline: wgpu::ComputePipeline, group: wgpu::BindGroup, params: Range<usize>, grid: [u32; 3], label: Arc<str> },
    Copy { src: Arc<GpuBuffer>, src_offset: u64, dst: Arc<GpuBuffer>, dst_offset: u64, size: u64 },
    Clear { buffer: Arc<GpuBuffer> },
}

/// The context's parameter arena: one uniform buffer and its bind group, grown on demand.
pub(crate) struct ParamArena {
    buffer: Arc<GpuBuffer>,
    group: wgpu::BindGroup,
}

/// Records dispatches for one submit. Holds every buffer it binds until it is submitted, so
/// dropping a tensor after recording an op on it is always safe.
pub struct Recorder {
    pub(crate) ctx: GpuContext,
    pub(crate) rec: Recording,
    /// The implicit stream's own recorder (it must not flush itself before submitting).
    pub(crate) is_stream: bool,
}

/// The context-free part of a recording (the implicit stream stores this, so that the context
/// does not own a reference to itself).
#[derive(Default)]
pub(crate) struct Recording {
    commands: Vec<Command>,
    params: Vec<u8>,
    keep: Vec<Arc<GpuBuffer>>,
    dispatches: usize,
    /// Readbacks recorded here: told their submission when it happens.
    reads: Vec<Arc<Mutex<ReadSlot>>>,
    /// Completion flags of earlier submits, reused once nothing else holds them.
    flags: Vec<Arc<AtomicBool>>,
}

/// Completion flags a recording keeps for reuse (more submits in flight get a new one each).
const KEPT_FLAGS: usize = 8;

impl Recording {
    /// Empties the recording, keeping its lists' capacity (and its completion flags).
    fn clear(&mut self) {
        self.commands.clear();
        self.params.clear();
        self.keep.clear();
        self.dispatches = 0;
        self.reads.clear();
    }

    /// A completion flag for the next submit: one no submission holds any more, or a new one.
    fn flag(&mut self) -> Arc<AtomicBool> {
        if let Some(f) = self.flags.iter().find(|f| Arc::strong_count(f) == 1) {
            f.store(false, std::sync::atomic::Ordering::Release);
            return f.clone();
        }
        let f = Arc::new(AtomicBool::new(false));
        if self.flags.len() < KEPT_FLAGS {
            self.flags.push(f.clone());
        }
        f
    }
}

impl GpuContext {
    /// A new, empty recording.
    pub fn recorder(&self) -> Recorder {
        Recorder { ctx: self.clone(), rec: Recording::default(), is_stream: false }
    }
}

impl Recorder {
    /// The context the recording belongs to.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    pub(crate) fn count_of(r: &Recording) -> usize {
        r.dispatches
    }

    /// Dispatches recorded so far.
    pub fn dispatch_count(&self) -> usize {
        self.rec.dispatches
    }

    /// Compute passes the current recording will use.
    pub fn pass_count(&self) -> usize {
        let mut passes = 0;
        let mut in_pass = false;
        for c in &self.rec.commands {
            match c {
                Command::Dispatch { .. } if !in_pass => {
                    passes += 1;
                    in_pass = true;
                }
                Command::Dispatch { .. } => {}
                Command::Copy { .. } | Command::Clear { .. } => in_pass = false,
            }
        }
        passes
    }

    /// True when nothing (no dispatch, copy or clear) has been recorded.
    pub fn is_empty(&self) -> bool {
        self.rec.commands.is_empty()
    }

    /// Records `kernel` over a bind group built beforehand with [`GpuContext::bind`].
    pub fn dispatch(&mut self, kernel: &Kernel, group: &BoundGroup, params: &[u32], grid: [u32; 3]) -> Result<()> {
        if group.layout_key != kernel.layout_key {
            return Err(NumrError::Validation {
                context: format!("recording kernel {}", kernel.name),
                message: "bind group was built for a different binding layout".into(),
            });
        }
        if params.len() * 4 > kernel.param_bytes as usize {
            return Err(NumrError::ParamsTooLarge { kernel: kernel.name.to_string(), needed: params.len() * 4, limit: kernel.param_bytes as usize });
        }
        let max = self.ctx.inner.caps.limits.max_compute_workgroups_per_dimension;
        if grid.iter().any(|&g| g > max) {
            return Err(NumrError::GridTooLarge { workgroups: grid.iter().map(|&g| g as u64).product(), limit: max });
        }
        let start = match kernel.param_mode {
            ParamMode::Immediates => self.rec.params.len(),
            ParamMode::UniformArena => {
                let align = self.ctx.inner.caps.limits.min_uniform_buffer_offset_alignment as usize;
                self.rec.params.len().div_ceil(align) * align
            }
        };
        self.rec.params.resize(start, 0);
        self.rec.params.extend_from_slice(bytemuck::cast_slice(params));
        self.rec.params.resize(start + kernel.param_bytes as usize, 0);
        self.rec.keep.extend(group.bindings.iter().map(|b| b.buffer.clone()));
        self.rec.commands.push(Command::Dispatch {
            pipeline: kernel.pipeline.clone(),
            group: group.group.clone(),
            params: start..start + kernel.param_bytes as usize,
            grid,
            label: kernel.name.clone(),
        });
        self.rec.dispatches += 1;
        Ok(())
    }

    /// Binds (through the bind-group cache) and records `kernel` in one call.
    pub fn dispatch_with(&mut self, kernel: &Kernel, bindings: &[Binding], params: &[u32], grid: [u32; 3]) -> Result<()> {
        let group = self.ctx.bind(kernel, bindings)?;
        self.dispatch(kernel, &group, params, grid)
    }

    /// Records a buffer-to-buffer copy (ends the current compute pass). Offsets and size must be
    /// multiples of 4.
    pub fn copy(&mut self, src: &Arc<GpuBuffer>, src_offset: u64, dst: &Arc<GpuBuffer>, dst_offset: u64, size: u64) -> Result<()> {
        if !src_offset.is_multiple_of(4)
            || !dst_offset.is_multiple_of(4)
            || !size.is_multiple_of(4)
            || src_offset.saturating_add(size) > src.capacity()
            || dst_offset.saturating_add(size) > dst.capacity()
        {
            return Err(NumrError::Validation {
                context: "recording a copy".into(),
                message: format!("copy {src:?}+{src_offset} -> {dst:?}+{dst_offset} of {size} bytes is misaligned or out of bounds"),
            });
        }
        self.rec.commands.push(Command::Copy { src: src.clone(), src_offset, dst: dst.clone(), dst_offset, size });
        Ok(())
    }

    /// Records zero-filling of the whole buffer (ends the current compute pass).
    pub fn clear(&mut self, buffer: &Arc<GpuBuffer>) -> Result<()> {
        self.rec.commands.push(Command::Clear { buffer: buffer.clone() });
        Ok(())
    }

    /// Records a copy of `len` bytes at `offset` of `buf` into a pooled readback buffer (ends the
    /// current compute pass). Once the recording is submitted, [`PendingRead::wait`] waits for
    /// that submission only (not for work submitted after it), and [`PendingRead::is_ready`]
    /// asks without blocking. A decode loop records token t+1, submits it, then reads token t.
    pub fn read(&mut self, buf: &Arc<GpuBuffer>, offset: u64, len: u64) -> Result<PendingRead> {
        let (start, end) = Self::read_span(buf, offset, len)?;
        let target = self.ctx.read_target(end - start)?;
        self.read_into(&target, buf, offset, len)
    }

    /// [`Self::read`] through `target`, a staging buffer made once with
    /// [`GpuContext::read_target`]: nothing is allocated. Errors while the target's previous
    /// read is outstanding (not yet waited for or dropped) or when the bytes do not fit it.
    pub fn read_into(&mut self, target: &ReadTarget, buf: &Arc<GpuBuffer>, offset: u64, len: u64) -> Result<PendingRead> {
        let (start, end) = Self::read_span(buf, offset, len)?;
        if end - start > target.staging.capacity() {
            return Err(NumrError::Validation {
                context: "recording a readback".into(),
                message: format!("{len} bytes at {offset} do not fit the read target of {} bytes", target.staging.capacity()),
            });
        }
        target.claim()?;
        if let Err(e) = self.copy(buf, start, &target.staging, 0, end - start) {
            target.release();
            return Err(e);
        }
        self.rec.reads.push(target.slot.clone());
        Ok(PendingRead::new(self.ctx.clone(), target.staging.clone(), (offset - start) as usize, len as usize, target.slot.clone()))
    }

    /// The 4-aligned byte range `[start, end)` a readback of `len` bytes at `offset` copies.
    fn read_span(buf: &Arc<GpuBuffer>, offset: u64, len: u64) -> Result<(u64, u64)> {
        let start = offset / 4 * 4;
        let end = (offset + len.max(1)).div_ceil(4) * 4;
        if end > buf.capacity() {
            return Err(NumrError::Validation {
                context: "recording a readback".into(),
                message: format!("{len} bytes at {offset} are past the end of {buf:?}"),
            });
        }
        Ok((start, end))
    }

    /// A uniform buffer of at least `need` bytes and its bind group (the parameter arena layout).
    fn new_arena(&self, need: u64) -> Result<ParamArena> {
        let buffer = self.ctx.alloc(need, BufferKind::Uniform)?;
        let layout = self.ctx.arena_layout();
        let group = self.ctx.scoped("creating the parameter arena", || {
            self.ctx.inner.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("numr-param-arena"),
                layout: &layout,
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: buffer.raw(),
                        offset: 0,
                        size: wgpu::BufferSize::new(super::kernel::MAX_PARAM_WORDS as u64 * 4),
                    }),
                }],
            })
        })?;
        Ok(ParamArena { buffer, group })
    }

    fn uses_arena(&self) -> bool {
        self.ctx.inner.caps.param_mode == ParamMode::UniformArena && !self.rec.params.is_empty()
    }

    fn arena_bytes(&self) -> u64 {
        self.rec.params.len() as u64 + super::kernel::MAX_PARAM_WORDS as u64 * 4
    }

    fn arena(&self) -> Result<Option<wgpu::BindGroup>> {
        if !self.uses_arena() {
            return Ok(None);
        }
        let mut slot = self.ctx.inner.arena.lock().unwrap_or_else(|p| p.into_inner());
        let need = self.arena_bytes();
        if slot.as_ref().is_none_or(|a| a.buffer.capacity() < need) {
            *slot = Some(self.new_arena(need.max(64 << 10))?);
        }
        Ok(slot.as_ref().map(|a| a.group.clone()))
    }

    fn encode(&self, arena: Option<&wgpu::BindGroup>, queries: Option<&QueryPlan>) -> wgpu::CommandBuffer {
        let dev = &self.ctx.inner.device;
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("numr") });
        let mut i = 0;
        let mut dispatch_index = 0u32;
        while i < self.rec.commands.len() {
            match &self.rec.commands[i] {
                Command::Copy { src, src_offset, dst, dst_offset, size } => {
                    enc.copy_buffer_to_buffer(src.raw(), *src_offset, dst.raw(), *dst_offset, *size);
                    i += 1;
                }
                Command::Clear { buffer } => {
                    enc.clear_buffer(buffer.raw(), 0, None);
                    i += 1;
                }
                Command::Dispatch { .. } => {
                    let per_pass = queries.is_some_and(|q| q.pass_level());
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: queries.filter(|q| q.pass_level()).map(|q| q.pass_writes(dispatch_index)),
                    });
                    while let Some(Command::Dispatch { pipeline, group, params, grid, .. }) = self.rec.commands.get(i) {
                        if let Some(q) = queries.filter(|q| !q.pass_level()) {
                            q.write_before(&mut pass, dispatch_index);
                        }
                        pass.set_pipeline(pipeline);
                        pass.set_bind_group(0, group, &[]);
                        match arena {
                            Some(a) => pass.set_bind_group(1, a, &[params.start as u32]),
                            None if !params.is_empty() => pass.set_immediates(0, &self.rec.params[params.clone()]),
                            None => {}
                        }
                        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
                        if let Some(q) = queries.filter(|q| !q.pass_level()) {
                            q.write_after(&mut pass, dispatch_index);
                        }
                        dispatch_index += 1;
                        i += 1;
                        if per_pass {
                            break;
                        }
                    }
                }
            }
        }
        if let Some(q) = queries {
            q.resolve(&mut enc);
        }
        enc.finish()
    }

    /// Encodes everything into one command buffer and submits it once. Returns when queued, with
    /// the [`Submission`] to wait on; GPU errors from encoding or submission come back as typed
    /// errors.
    ///
    /// Work recorded earlier into the context's implicit stream (eager ops, `Tensor::zeros`
    /// clears, cache clears) is submitted first, so the GPU runs everything in the order the
    /// program asked for it, whichever path recorded it.
    pub fn submit(mut self) -> Result<Submission> {
        self.submit_inner(None)
    }

    /// [`Self::submit`], leaving the recorder empty and ready for the next recording with the
    /// memory of this one (its lists' capacity), so that a loop recording one step after another
    /// into one recorder allocates nothing. The recording is dropped even when submitting fails.
    pub fn submit_and_clear(&mut self) -> Result<Submission> {
        let out = self.submit_inner(None);
        self.rec.clear();
        out
    }

    fn submit_inner(&mut self, queries: Option<&QueryPlan>) -> Result<Submission> {
        if self.rec.commands.is_empty() {
            return Ok(Submission::done(&self.ctx));
        }
        // The implicit stream's pending work, then this recording, under one hold of the lock.
        let ctx = self.ctx.clone();
        let guard = ctx.inner.submit_lock.lock().unwrap_or_else(|p| p.into_inner());
        if !self.is_stream {
            ctx.flush_locked(&guard)?;
        }
        self.submit_locked(queries, &guard)
    }

    /// Encodes and submits with the context's submit lock held by the caller.
    pub(crate) fn submit_locked(&mut self, queries: Option<&QueryPlan>, _held: &std::sync::MutexGuard<'_, ()>) -> Result<Submission> {
        if self.rec.commands.is_empty() {
            return Ok(Submission::done(&self.ctx));
        }
        let arena = self.arena()?;
        let index = self.ctx.scoped("submitting a recording", || {
            let cmd = self.encode(arena.as_ref(), queries);
            if arena.is_some() {
                let slot = self.ctx.inner.arena.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(a) = slot.as_ref() {
                    self.ctx.inner.queue.write_buffer(a.buffer.raw(), 0, &self.rec.params);
                }
            }
            self.ctx.inner.queue.submit([cmd])
        })?;
        let flag = self.rec.flag();
        Ok(Submission::submitted(&self.ctx, index, &self.rec.reads, flag))
    }

    /// Encodes the recording now and returns it ready to submit later. Encoding is the CPU cost
    /// of a recording (wgpu's validation and the driver's command building); doing it ahead lets
    /// the CPU prepare the next batch while the GPU runs this one, and lets benchmarks time the
    /// GPU alone. Parameters go to a uniform buffer of the recording's own where the adapter has
    /// no immediates, so several finished recordings never share one.
    pub fn finish(self) -> Result<Recorded> {
        let own = if self.uses_arena() { Some(self.new_arena(self.arena_bytes())?) } else { None };
        let cmd = self.ctx.scoped("encoding a recording", || self.encode(own.as_ref().map(|a| &a.group), None))?;
        Ok(Recorded {
            ctx: self.ctx,
            cmd: Some(cmd),
            params: self.rec.params,
            arena: own,
            _keep: self.rec.keep,
            dispatches: self.rec.dispatches,
            reads: self.rec.reads,
        })
    }

    /// Submits with GPU timestamps around every dispatch (or every pass, where the adapter only
    /// has pass-level timestamps), waits, and returns the time per labelled dispatch.
    pub fn submit_profiled(mut self) -> Result<Profile> {
        let labels: Vec<Arc<str>> =
            self.rec.commands.iter().filter_map(|c| if let Command::Dispatch { label, .. } = c { Some(label.clone()) } else { None }).collect();
        let plan = QueryPlan::new(&self.ctx, labels.len() as u32)?;
        let submission = self.submit_inner(Some(&plan))?;
        plan.read(&self.ctx, labels, &submission)
    }
}

/// A recording encoded by [`Recorder::finish`], submitted once with [`Recorded::submit`]. It
/// keeps every buffer it binds alive until dropped.
pub struct Recorded {
    ctx: GpuContext,
    cmd: Option<wgpu::CommandBuffer>,
    params: Vec<u8>,
    arena: Option<ParamArena>,
    _keep: Vec<Arc<GpuBuffer>>,
    dispatches: usize,
    reads: Vec<Arc<Mutex<ReadSlot>>>,
}

impl Recorded {
    /// Dispatches in the recording.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Submits the encoded commands (after the implicit stream's pending work, as
    /// [`Recorder::submit`]). Returns when queued.
    pub fn submit(mut self) -> Result<Submission> {
        let Some(cmd) = self.cmd.take() else { return Ok(Submission::done(&self.ctx)) };
        let guard = self.ctx.inner.submit_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.ctx.flush_locked(&guard)?;
        let index = self.ctx.scoped("submitting a finished recording", || {
            if let Some(a) = &self.arena {
                self.ctx.inner.queue.write_buffer(a.buffer.raw(), 0, &self.params);
            }
            self.ctx.inner.queue.submit([cmd])
        })?;
        Ok(Submission::submitted(&self.ctx, index, &self.reads, Arc::new(AtomicBool::new(false))))
    }
}
