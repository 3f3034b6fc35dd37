//! The bandwidth roofline of the run: numr's streaming-read kernel over one large buffer, timed
//! from submit to completion over many repetitions in one recording after a warm-up (so the
//! GPU's clocks are up and the CPU's encoding is not counted).

use std::time::Instant;

use std::sync::Arc;

use numr::gpu::{Binding, BoundGroup, BufferKind, GpuContext, Kernel, KernelEnv, Recorder, grid_2d};
use numr::kernels::stream::StreamRead;

/// numr's streaming-read kernel bound over one buffer of up to `bytes` (capped by one binding),
/// ready to record: the roofline's workload and the bench's clock warm-up.
pub(crate) struct StreamReads {
    kernel: Arc<Kernel>,
    group: BoundGroup,
    params: [u32; 2],
    grid: [u32; 3],
    /// Bytes one dispatch reads.
    pub bytes: u64,
}

impl StreamReads {
    pub(crate) fn new(ctx: &GpuContext, bytes: u64) -> Result<StreamReads, numr::NumrError> {
        let limits = &ctx.capabilities().limits;
        let bytes = bytes.min(limits.max_storage_buffer_binding_size.min(limits.max_buffer_size)) / 16 * 16;
        let src = ctx.alloc(bytes, BufferKind::Storage)?;
        let kernel = ctx.kernel(&StreamRead.source(&KernelEnv::from_caps(ctx.capabilities())))?;
        let n_vec4 = u32::try_from(bytes / 16).unwrap_or(u32::MAX);
        let workgroups = (n_vec4 / 256).clamp(1, 16384);
        let dst = ctx.alloc(workgroups as u64 * 4, BufferKind::Storage)?;
        let group = ctx.bind(&kernel, &[Binding::whole(&src), Binding::whole(&dst)])?;
        let grid = grid_2d(workgroups as u64, 65535).expect("at most 16384 workgroups");
        Ok(StreamReads { kernel, group, params: [n_vec4, workgroups * 256], grid, bytes })
    }

    /// Records `n` reads of the whole buffer.
    pub(crate) fn record(&self, rec: &mut Recorder, n: usize) -> Result<(), numr::NumrError> {
        for _ in 0..n {
            rec.dispatch(&self.kernel, &self.group, &self.params, self.grid)?;
        }
        Ok(())
    }
}

/// Bytes per second of a plain streaming read of up to `bytes` (capped by one binding), the
/// median of 5 timed trials of `reps` reads each.
pub fn stream_read_bps(ctx: &GpuContext, bytes: u64, reps: usize) -> Result<f64, numr::NumrError> {
    let reads = StreamReads::new(ctx, bytes)?;
    let trial = || -> Result<f64, numr::NumrError> {
        let mut rec = ctx.recorder();
        reads.record(&mut rec, reps)?;
        let done = rec.finish()?;
        ctx.sync()?;
        let t = Instant::now();
        done.submit()?;
        ctx.sync()?;
        Ok(t.elapsed().as_secs_f64())
    };
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < 0.3 {
        trial()?;
    }
    let mut times = (0..5).map(|_| trial()).collect::<Result<Vec<f64>, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok((reads.bytes * reps as u64) as f64 / times[2])
}
