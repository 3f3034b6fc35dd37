//! Does warming the L2 with the next kernel's weights pay in a dependent chain?
//! (`cargo xtask bench --kernels --only prefetch`)
//!
//! In a decode step every GEMV waits on the one before (a barrier), but its weights do not
//! depend on anything. A streaming read of the first bytes of the *next* GEMV's weights, recorded
//! right after the current GEMV with no hazard between them (its own output word), can run in the
//! current GEMV's tail, when the GPU's memory system idles while the last workgroups finish; the
//! next GEMV then starts on L2 hits. Each row is a chain over weight copies rotated past the L2,
//! with and without that prefetch of `F` bytes; bytes counted are the chain's own (the prefetched
//! bytes are the same bytes, read early).

use std::sync::Arc;

use numr::Result;
use numr::gpu::{Binding, BoundGroup, BufferKind, GpuBuffer, GpuContext, Kernel, KernelEnv, Recorder, StepValues, grid_2d};
use numr::kernels::stream::StreamRead;

use crate::Measurement;
use crate::quant::{copies_for, err, random_weight, time_rotating, upload_copies};
use boostr::formats::GgmlType;
use boostr::quant::{GemvOutput, Q8Activations, Q8GemvPlan, QuantGemvQ8, WeightKind};

/// vec4 words each prefetch invocation reads.
const PF_PER_THREAD: u64 = 4;

/// One prefetch dispatch per repetition: the first `bytes` of `buffers[(i + 1) % len]`, each into
/// an output word of its own (so nothing orders it against the chain).
struct Prefetch {
    kernel: Arc<Kernel>,
    groups: Vec<BoundGroup>,
    params: [u32; 2],
    grid: [u32; 3],
}

impl Prefetch {
    fn new(ctx: &GpuContext, buffers: &[Arc<GpuBuffer>], bytes: u64, reps: usize) -> Result<Option<Prefetch>> {
        let bytes = bytes.min(buffers.iter().map(|b| b.len()).min().unwrap_or(0)) / 16 * 16;
        if bytes == 0 {
            return Ok(None);
        }
        let env = KernelEnv::from_caps(ctx.capabilities());
        let kernel = ctx.kernel(&StreamRead.source(&env))?;
        let n_vec4 = (bytes / 16) as u32;
        let wgs = (n_vec4 as u64).div_ceil(256 * PF_PER_THREAD) as u32;
        let groups = (0..reps)
            .map(|i| {
                let src = Binding { buffer: buffers[(i + 1) % buffers.len()].clone(), offset: 0, size: bytes };
                let dst = ctx.alloc(wgs as u64 * 4, BufferKind::Storage)?;
                ctx.bind(&kernel, &[src, Binding::whole(&dst)])
            })
            .collect::<Result<_>>()?;
        Ok(Some(Prefetch { kernel, groups, params: [n_vec4, wgs * 256], grid: grid_2d(wgs as u64, 65535).expect("grid") }))
    }

    fn record(&self, rec: &mut Recorder, i: usize) -> Result<()> {
        rec.dispatch(&self.kernel, &self.groups[i], &self.params, self.grid)
    }
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// A dependent chain of streaming reads of `bytes` (rotating over copies, one shared output: a
/// barrier between them), each followed by a prefetch of `pf` bytes of the next copy.
fn stream_chain(ctx: &GpuContext, bytes: u64, pf: u64, reps: usize, quick: bool) -> Result<Measurement> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let k = ctx.kernel(&StreamRead.source(&env))?;
    let n_vec4 = (bytes / 16) as u32;
    let wgs = (n_vec4 as u64).div_ceil(256 * 4) as u32;
    let copies = if quick { 2 } else { copies_for(bytes as usize) };
    let srcs: Vec<Arc<GpuBuffer>> = (0..copies).map(|_| ctx.alloc(bytes, BufferKind::Storage)).collect::<Result<_>>()?;
    let dst = ctx.alloc(wgs as u64 * 4, BufferKind::Storage)?;
    let groups: Vec<BoundGroup> = srcs.iter().map(|s| ctx.bind(&k, &[Binding::whole(s), Binding::whole(&dst)])).collect::<Result<_>>()?;
    let pre = Prefetch::new(ctx, &srcs, pf, reps)?;
    let grid = grid_2d(wgs as u64, 65535).expect("grid");
    let (wall, _) = time_rotating(ctx, reps, "stream_read", |rec, i| {
        rec.dispatch(&k, &groups[i % copies], &[n_vec4, wgs * 256], grid)?;
        if let Some(p) = &pre { p.record(rec, i) } else { Ok(()) }
    })?;
    Ok(Measurement {
        label: format!("stream chain {:.1} MB x{copies}, prefetch {:.1} MB of the next [wall]", mb(bytes), mb(pf.min(bytes))),
        seconds: wall,
        bytes: bytes as f64,
        flops: 0.0,
    })
}

/// A dependent chain of integer-dot GEMVs of `n x k` Q4_0 (rotating over copies, one shared
/// output), each followed by a prefetch of `pf` bytes of the next copy's buffer (its first rows'
/// quants: the sections start with the codes, in row order).
fn gemv_chain(ctx: &GpuContext, n: usize, k: usize, pfs: &[f64], reps: usize, quick: bool) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let kind = WeightKind::Ggml(GgmlType::Q4_0);
    let p = random_weight(kind, n, k, 7)?;
    let bytes = p.total_bytes();
    let ws = upload_copies(ctx, &p, if quick { 2 } else { copies_for(bytes) })?;
    let cfg = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::for_matrix(kind, &env, 1, n, k) };
    let x = ctx.alloc(4 * k as u64, BufferKind::Storage)?;
    let y = ctx.alloc(4 * n as u64, BufferKind::Storage)?;
    let xa = Q8Activations::new(ctx, &Binding::whole(&x), 1, k).map_err(err)?;
    let out = GemvOutput::Single(Binding::whole(&y));
    let plans = ws.iter().map(|w| Q8GemvPlan::new(ctx, &cfg, w, &xa, &out).map_err(err)).collect::<Result<Vec<_>>>()?;
    let step = StepValues::chunk(0, 1);
    let mut rec = ctx.recorder();
    xa.record(&mut rec, &step).map_err(err)?;
    rec.submit()?;
    let buffers: Vec<Arc<GpuBuffer>> = ws.iter().map(|w| w.parts[0].buffer.clone()).collect();
    let mut v = Vec::new();
    for &f in pfs {
        let pf = (bytes as f64 * f) as u64;
        let pre = Prefetch::new(ctx, &buffers, pf, reps)?;
        let (wall, _) = time_rotating(ctx, reps, "quant_gemv_q8", |rec, i| {
            plans[i % plans.len()].record(rec, &step).map_err(err)?;
            if let Some(p) = &pre { p.record(rec, i) } else { Ok(()) }
        })?;
        v.push(Measurement {
            label: format!("gemv-q8 chain Q4_0 {n}x{k} x{}, prefetch {:.1} MB ({:.0}%) of the next [wall]", ws.len(), mb(pf), f * 100.0),
            seconds: wall,
            bytes: bytes as f64,
            flops: 0.0,
        });
    }
    Ok(v)
}

/// The prefetch table (see the module docs).
pub fn prefetch_table(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let reps = if quick { 4 } else { 64 };
    let mut v = vec![crate::stream_read(ctx, if quick { 64 << 20 } else { 1 << 30 }, if quick { 3 } else { 20 })?];
    let bytes: u64 = if quick { 1 << 20 } else { 33_030_144 };
    let mbs: &[u64] = if quick { &[0, 1] } else { &[0, 2, 4, 8, 16, 24, 33] };
    for &m in mbs {
        v.push(stream_chain(ctx, bytes, m * 1_000_000, reps, quick)?);
    }
    let shapes: &[(usize, usize)] = if quick { &[(256, 512)] } else { &[(4096, 14336), (28672, 4096), (4096, 4096), (6144, 4096)] };
    let fractions: &[f64] = if quick { &[0.0, 0.5] } else { &[0.0, 0.1, 0.25, 0.5, 1.0] };
    for &(n, k) in shapes {
        v.extend(gemv_chain(ctx, n, k, fractions, reps, quick)?);
    }
    Ok(v)
}
