//! Keeping the GPU's clocks up before each timed run.
//!
//! On the H200 a short burst of work (a 512-token prompt of a 1B model is about 12 ms) runs at
//! whatever clocks the GPU has dropped to since its last work: the same file's pp512 swung
//! between 10,000 and 43,000 tok/s from one run to the next, for llama.cpp as for cera. The bench
//! therefore loads the GPU with streaming reads for a fixed time right before every timed run,
//! of either engine (`--warm-ms`, 0 turns it off), so that both start each run at the same
//! clocks.

use std::time::{Duration, Instant};

use numr::NumrError;
use numr::gpu::{Binding, BoundGroup, BufferKind, GpuContext, Kernel, KernelEnv, grid_2d};
use numr::kernels::stream::StreamRead;
use std::sync::Arc;

/// Bytes each warm-up dispatch reads.
const WARM_BYTES: u64 = 64 << 20;

/// Streaming reads on a device of its own (see the module docs).
pub struct ClockWarmer {
    ctx: GpuContext,
    kernel: Arc<Kernel>,
    group: BoundGroup,
    params: [u32; 2],
    grid: [u32; 3],
    time: Duration,
}

impl ClockWarmer {
    /// A warmer loading the default adapter for `ms` milliseconds per call, or `None` when `ms`
    /// is 0.
    pub fn new(ms: u64) -> Result<Option<ClockWarmer>, NumrError> {
        if ms == 0 {
            return Ok(None);
        }
        let ctx = GpuContext::new()?;
        let limits = &ctx.capabilities().limits;
        let bytes = WARM_BYTES.min(limits.max_storage_buffer_binding_size.min(limits.max_buffer_size)) / 16 * 16;
        let kernel = ctx.kernel(&StreamRead.source(&KernelEnv::from_caps(ctx.capabilities())))?;
        let n_vec4 = u32::try_from(bytes / 16).unwrap_or(u32::MAX);
        let workgroups = (n_vec4 / 256).clamp(1, 16384);
        let src = ctx.alloc(bytes, BufferKind::Storage)?;
        let dst = ctx.alloc(workgroups as u64 * 4, BufferKind::Storage)?;
        let group = ctx.bind(&kernel, &[Binding::whole(&src), Binding::whole(&dst)])?;
        let grid = grid_2d(workgroups as u64, 65535).expect("at most 16384 workgroups");
        Ok(Some(ClockWarmer { ctx, kernel, group, params: [n_vec4, workgroups * 256], grid, time: Duration::from_millis(ms) }))
    }

    /// Keeps the GPU busy for the configured time, then returns with it idle.
    pub fn warm(&self) -> Result<(), NumrError> {
        let start = Instant::now();
        while start.elapsed() < self.time {
            let mut rec = self.ctx.recorder();
            for _ in 0..8 {
                rec.dispatch(&self.kernel, &self.group, &self.params, self.grid)?;
            }
            rec.submit()?;
            self.ctx.sync()?;
        }
        Ok(())
    }
}

/// Runs `w.warm()` when there is a warmer.
pub(crate) fn warm(w: Option<&ClockWarmer>) -> Result<(), NumrError> {
    w.map_or(Ok(()), ClockWarmer::warm)
}

#[cfg(test)]
mod tests {
    use super::ClockWarmer;

    #[test]
    fn zero_milliseconds_is_no_warmer() {
        // No device is opened for `--warm-ms 0`.
        assert!(ClockWarmer::new(0).unwrap().is_none());
        assert!(super::warm(None).is_ok());
    }
}
