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
use numr::gpu::GpuContext;

use super::BenchError;
use super::roofline::StreamReads;

/// Bytes each warm-up dispatch reads.
const WARM_BYTES: u64 = 64 << 20;

/// Streaming reads on a device of its own (see the module docs).
pub struct ClockWarmer {
    ctx: GpuContext,
    reads: StreamReads,
    time: Duration,
}

impl ClockWarmer {
    /// A warmer loading the default adapter for `ms` milliseconds per call, or `None` when `ms`
    /// is 0.
    pub fn new(ms: u64) -> Result<Option<ClockWarmer>, BenchError> {
        if ms == 0 {
            return Ok(None);
        }
        Self::open(Duration::from_millis(ms)).map(Some).map_err(|e| BenchError::Warm(e.to_string()))
    }

    fn open(time: Duration) -> Result<ClockWarmer, NumrError> {
        let ctx = GpuContext::new()?;
        let reads = StreamReads::new(&ctx, WARM_BYTES)?;
        Ok(ClockWarmer { ctx, reads, time })
    }

    /// Keeps the GPU busy for the configured time, then returns with it idle.
    pub fn warm(&self) -> Result<(), NumrError> {
        let start = Instant::now();
        while start.elapsed() < self.time {
            let mut rec = self.ctx.recorder();
            self.reads.record(&mut rec, 8)?;
            rec.submit()?;
            self.ctx.sync()?;
        }
        Ok(())
    }
}

/// Runs `w.warm()` when there is a warmer.
pub(crate) fn warm(w: Option<&ClockWarmer>) -> Result<(), BenchError> {
    w.map_or(Ok(()), ClockWarmer::warm).map_err(|e| BenchError::Warm(e.to_string()))
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
