//! The model's weights on the GPU, uploaded once at load into boostr's repacked layouts (F32
//! projection matrices narrowed to F16, or BF16 where f16's range is too small):
//! mat-vec matrices ([`QuantMatrix`], split by rows over the binding limit), the embedding table
//! ([`GpuEmbedding`]: a [`QuantMatrix`] too, one matrix with a tied LM head), and f32 vectors. A [`Op::Linear`] over several matrices of
//! one format is uploaded as ONE matrix (rows concatenated: fused Q/K/V, fused gate/up); matrices
//! of different formats (K-quant mixes store V in another type than Q and K) stay separate and
//! write their columns of the packed output.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use boostr::embedding::GpuEmbedding;
use boostr::formats::{GgmlType, PackedFormat, PackedWeights, repack};
use boostr::ops_common::GpuView;
use boostr::quant::{BlockRows, MatrixRows, PreparedMatrix, QuantMatrix, WordPool, binding_limit};
use numr::gpu::GpuContext;

use super::super::EngineError;
use super::super::backend::{LoadProgress, ProgressFn};
use super::super::graph::{MatRef, ModelGraph, Op};
use super::super::weights::{RawMat, WeightSource};
use super::dev_err;

/// One matrix of a linear op and the first output column it writes.
#[derive(Clone)]
pub(crate) struct LinearPart {
    pub(crate) w: Arc<QuantMatrix>,
    pub(crate) col0: usize,
}

/// Every weight of the graph, on the GPU.
pub(crate) struct GpuWeights {
    /// Per op index: the parts of a `Linear` or `LmHead`.
    pub(crate) linear: HashMap<usize, Vec<LinearPart>>,
    /// Per op index: the table of an `Embed`.
    pub(crate) embed: HashMap<usize, Arc<GpuEmbedding>>,
    /// Vectors (and LFM2's f32 conv taps) by tensor name.
    pub(crate) vecs: HashMap<String, GpuView>,
    /// The host copies of vectors (RoPE frequency factors are folded into frequencies).
    pub(crate) host_vecs: HashMap<String, Vec<f32>>,
    /// Bytes uploaded.
    pub(crate) bytes: u64,
    /// Time spent writing to the device.
    pub(crate) write_time: Duration,
    /// Time the writing thread waited for the host's preparation of the next matrix.
    pub(crate) wait_time: Duration,
}

/// Total bytes the upload reads from the file (for progress).
pub(super) fn total_bytes(graph: &ModelGraph, src: &dyn WeightSource) -> Result<u64, EngineError> {
    let mut t = 0u64;
    for op in &graph.ops {
        for m in op.mats() {
            t += src.stored(m)?.bytes;
        }
        for v in op.vecs() {
            t += 4 * v.len as u64;
        }
    }
    Ok(t)
}

impl GpuWeights {
    /// Uploads every weight of `graph`. The matrices are prepared on the host (repacked,
    /// concatenated, laid out in their GPU sections: [`PreparedMatrix`]) by worker threads, at
    /// most a few ahead, while this thread writes the prepared ones to the device in the order
    /// they come; vectors and conv taps follow.
    pub(crate) fn upload(ctx: &GpuContext, graph: &ModelGraph, src: &dyn WeightSource, progress: Option<ProgressFn<'_>>) -> Result<GpuWeights, EngineError> {
        let total = total_bytes(graph, src)?;
        let mut done = 0u64;
        let mut tick = |n: u64| {
            done += n;
            if let Some(p) = progress {
                p(LoadProgress { done, total });
            }
        };
        let mut w = GpuWeights {
            linear: HashMap::new(),
            embed: HashMap::new(),
            vecs: HashMap::new(),
            host_vecs: HashMap::new(),
            bytes: 0,
            write_time: Duration::ZERO,
            wait_time: Duration::ZERO,
        };
        let jobs: Vec<usize> = (0..graph.ops.len()).filter(|&i| matches!(graph.ops[i], Op::Embed { .. } | Op::Linear { .. } | Op::LmHead { .. })).collect();
        let limit = binding_limit(ctx);
        // A tensor more than one op reads (the tied LM head and the embedding) is repacked once
        // and kept until the load ends (two workers may both make it at worst); every other
        // host copy goes as soon as its matrix is written.
        let mut uses: HashMap<&str, usize> = HashMap::new();
        for &op in &jobs {
            for m in graph.ops[op].mats() {
                *uses.entry(m.name.as_str()).or_default() += 1;
            }
        }
        let shared: HashSet<&str> = uses.into_iter().filter(|&(_, n)| n > 1).map(|(name, _)| name).collect();
        let cache = PackCache { shared: &shared, packed: Mutex::new(HashMap::new()), claimed: Mutex::new(HashSet::new()) };
        // Matrices more than one op reads, uploaded once (a tied LM head and its embedding table
        // gathered as a matrix), and the ops that wait for one of them.
        let mut by_name: HashMap<String, Arc<QuantMatrix>> = HashMap::new();
        let mut aliases: Vec<(usize, String)> = Vec::new();
        let mut bulk = ctx.bulk_upload().map_err(|e| dev_err(ctx, e))?;
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, MAX_PREPARE_THREADS).min(jobs.len().max(1));
        // The parts' words go back here once written: at most one matrix per worker and per
        // queued result is out at a time, so the spares cover the next ones.
        let pool = WordPool::new(2 * workers + 2);
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| -> Result<(), EngineError> {
            let (tx, rx) = mpsc::sync_channel::<(usize, Result<Prepared, EngineError>)>(workers);
            for _ in 0..workers {
                let tx = tx.clone();
                let (jobs, next, stop, cache, pool) = (&jobs, &next, &stop, &cache, &pool);
                scope.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Some(&op) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                        let r = prepare(&graph.ops[op], src, limit, cache, pool);
                        if tx.send((op, r)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            let result = (|| {
                let mut waited = Instant::now();
                for (op, r) in rx.iter() {
                    let t = Instant::now();
                    w.wait_time += t - waited;
                    // The one tensor of a single-matrix op that another op reads too.
                    let shared_name = match graph.ops[op].mats().as_slice() {
                        [m] if shared.contains(m.name.as_str()) => Some(m.name.clone()),
                        _ => None,
                    };
                    match r? {
                        Prepared::EmbedMatrix(m, name) => {
                            w.bytes += m.bytes();
                            let m = Arc::new(m.upload_bulk(&mut bulk, Some(&pool)).map_err(|e| quant_err(ctx, e))?);
                            let t = GpuEmbedding::from_matrix(m.clone()).map_err(|e| EngineError::Unsupported { what: format!("tensor {name}: {e}") })?;
                            w.embed.insert(op, Arc::new(t));
                            if let Some(name) = shared_name {
                                by_name.insert(name, m);
                            }
                        }
                        Prepared::Linear(parts) => {
                            let mut up = Vec::with_capacity(parts.len());
                            for (m, col0) in parts {
                                w.bytes += m.bytes();
                                up.push(LinearPart { w: Arc::new(m.upload_bulk(&mut bulk, Some(&pool)).map_err(|e| quant_err(ctx, e))?), col0 });
                            }
                            if let (Some(name), [one]) = (shared_name, up.as_slice()) {
                                by_name.insert(name, one.w.clone());
                            }
                            w.linear.insert(op, up);
                        }
                        Prepared::Alias(name) => aliases.push((op, name)),
                    }
                    w.write_time += t.elapsed();
                    tick(graph.ops[op].mats().iter().map(|m| src.stored(m).map_or(0, |s| s.bytes)).sum());
                    waited = Instant::now();
                }
                Ok(())
            })();
            // On an error the workers stop after their current matrix.
            stop.store(true, Ordering::Relaxed);
            drop(rx);
            result
        })?;
        for (op, name) in aliases {
            let m = by_name.get(&name).cloned().ok_or_else(|| EngineError::MissingTensor { name: name.clone() })?;
            if matches!(graph.ops[op], Op::Embed { .. }) {
                let t = GpuEmbedding::from_matrix(m).map_err(|e| EngineError::Unsupported { what: format!("tensor {name}: {e}") })?;
                w.embed.insert(op, Arc::new(t));
            } else {
                w.linear.insert(op, vec![LinearPart { w: m, col0: 0 }]);
            }
        }
        let t = Instant::now();
        for op in &graph.ops {
            // The conv taps as f32, stored by name like the vectors.
            if let Op::ShortConv { w: m, .. } = op
                && !w.vecs.contains_key(&m.name)
            {
                let host = src.mat_f32(m)?;
                let buf = bulk.upload(bytemuck::cast_slice(&host)).map_err(|e| dev_err(ctx, e))?;
                tick(src.stored(m)?.bytes);
                w.bytes += 4 * host.len() as u64;
                w.vecs.insert(m.name.clone(), GpuView::whole(&buf));
            }
            for v in op.vecs() {
                if w.vecs.contains_key(&v.name) {
                    continue;
                }
                let host = src.vec(v)?;
                let buf = bulk.upload(bytemuck::cast_slice(&host)).map_err(|e| dev_err(ctx, e))?;
                tick(4 * v.len as u64);
                w.bytes += 4 * v.len as u64;
                w.vecs.insert(v.name.clone(), GpuView::whole(&buf));
                w.host_vecs.insert(v.name.clone(), host);
            }
        }
        // The last batches: when this returns the weights are on the device, so the first
        // step waits for no upload.
        bulk.finish().map_err(|e| dev_err(ctx, e))?;
        w.write_time += t.elapsed();
        Ok(w)
    }
}

/// The most threads preparing matrices at load (each holds one matrix's host copies at a time).
const MAX_PREPARE_THREADS: usize = 8;

/// A matrix op's weights laid out on the host.
enum Prepared {
    /// An embedding table laid out as a matrix, and its name.
    EmbedMatrix(PreparedMatrix, String),
    /// A single-matrix op whose matrix another op prepares and uploads (a tied LM head and its
    /// embedding table): the tensor's name.
    Alias(String),
    /// A linear op's matrices (one, where several of one format are concatenated by rows) and
    /// the first output column of each.
    Linear(Vec<(PreparedMatrix, usize)>),
}

/// The host repacks of the tensors several ops read.
struct PackCache<'a> {
    shared: &'a HashSet<&'a str>,
    packed: Mutex<HashMap<String, Arc<PackedWeights>>>,
    /// The shared tensors an op has taken on to upload as a matrix for every op that reads it.
    claimed: Mutex<HashSet<String>>,
}

/// The host work of one matrix op (a worker thread's job). A matrix the file stores in a block
/// type the kernels read is laid out from the file's bytes (one copy); others (AWQ/GPTQ, F32
/// narrowed to F16) are repacked first.
fn prepare(op: &Op, src: &dyn WeightSource, limit: u64, cache: &PackCache, pool: &WordPool) -> Result<Prepared, EngineError> {
    let packed = |m: &MatRef| -> Result<Arc<PackedWeights>, EngineError> {
        if !cache.shared.contains(m.name.as_str()) {
            return Ok(Arc::new(src.packed(m)?));
        }
        if let Some(p) = cache.packed.lock().unwrap_or_else(|p| p.into_inner()).get(&m.name) {
            return Ok(p.clone());
        }
        let p = Arc::new(src.packed(m)?);
        cache.packed.lock().unwrap_or_else(|p| p.into_inner()).insert(m.name.clone(), p.clone());
        Ok(p)
    };
    // A table in the file's blocks is one matrix with a tied LM head: the first op to
    // claim it prepares it, the other waits for it.
    let mats = op.mats();
    if let [m] = mats.as_slice()
        && cache.shared.contains(m.name.as_str())
        && matrix_table(src, m)?.is_some()
        && !cache.claimed.lock().unwrap_or_else(|p| p.into_inner()).insert(m.name.clone())
    {
        return Ok(Prepared::Alias(m.name.clone()));
    }
    match op {
        Op::Embed { table, .. } => {
            // From the file's blocks, or repacked (an F32 table, one the source builds).
            let packed_table;
            let rows = match matrix_table(src, table)? {
                Some(raw) => MatrixRows::Blocks(
                    BlockRows::new(raw.ty, raw.bytes, raw.rows, raw.cols)
                        .map_err(|e| EngineError::Unsupported { what: format!("tensor {} of type {}: {e}", raw.name, raw.ty.name()) })?,
                ),
                None => {
                    packed_table = packed(table)?;
                    MatrixRows::Packed(&packed_table)
                }
            };
            let m = PreparedMatrix::lay_out(&table.name, &[rows], limit, Some(pool))
                .map_err(|e| EngineError::Unsupported { what: format!("tensor {}: {e}", table.name) })?;
            Ok(Prepared::EmbedMatrix(m, table.name.clone()))
        }
        _ => {
            let mut sources = Vec::with_capacity(mats.len());
            for m in &mats {
                sources.push(match src.file_rows(m)?.filter(|r| r.ty != GgmlType::F32) {
                    Some(raw) => Source::File(raw),
                    None => Source::Packed(narrow_f32(packed(m)?)?),
                });
            }
            let rows = sources
                .iter()
                .map(|s| match s {
                    Source::File(r) => BlockRows::new(r.ty, r.bytes, r.rows, r.cols)
                        .map(MatrixRows::Blocks)
                        .map_err(|e| EngineError::Unsupported { what: format!("tensor {} of type {}: {e}", r.name, r.ty.name()) }),
                    Source::Packed(p) => Ok(MatrixRows::Packed(p)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let same = rows.windows(2).all(|p| (p[0].format(), p[0].cols()) == (p[1].format(), p[1].cols()));
            if same && rows.len() > 1 {
                let name = names(&mats);
                let m =
                    PreparedMatrix::lay_out(&name, &rows, limit, Some(pool)).map_err(|e| EngineError::Unsupported { what: format!("fusing {name}: {e}") })?;
                return Ok(Prepared::Linear(vec![(m, 0)]));
            }
            let mut col0 = 0;
            let mut parts = Vec::with_capacity(rows.len());
            for (m, r) in mats.iter().zip(&rows) {
                let prepared = PreparedMatrix::lay_out(&m.name, std::slice::from_ref(r), limit, Some(pool))
                    .map_err(|e| EngineError::Unsupported { what: format!("tensor {}: {e}", m.name) })?;
                parts.push((prepared, col0));
                col0 += m.rows;
            }
            Ok(Prepared::Linear(parts))
        }
    }
}

/// The embedding table `m` as the file's blocks, which a tied LM head shares as one matrix; not
/// an F32 table, which the LM head narrows to F16 while the embedding keeps it exact.
fn matrix_table<'a>(src: &'a dyn WeightSource, m: &'a MatRef) -> Result<Option<RawMat<'a>>, EngineError> {
    Ok(src.file_rows(m)?.filter(|r| r.ty != GgmlType::F32))
}

/// Where a matrix's rows come from: the file's blocks, or a repack.
enum Source<'a> {
    File(RawMat<'a>),
    Packed(Arc<PackedWeights>),
}

impl GpuWeights {
    /// The vector (or LFM2 conv taps) `name` on the GPU; [`EngineError::MissingTensor`] when it
    /// was not uploaded.
    pub(crate) fn vec(&self, name: &str) -> Result<&GpuView, EngineError> {
        self.vecs.get(name).ok_or_else(|| EngineError::MissingTensor { name: name.to_string() })
    }

    /// The host copy of the vector `name`; [`EngineError::MissingTensor`] when it was not
    /// uploaded.
    pub(crate) fn host_vec(&self, name: &str) -> Result<&[f32], EngineError> {
        self.host_vecs.get(name).map(Vec::as_slice).ok_or_else(|| EngineError::MissingTensor { name: name.to_string() })
    }

    /// The parts (at least one) of `graph`'s linear op `op`; [`EngineError::MissingTensor`]
    /// naming its matrices when they were not uploaded.
    pub(crate) fn linear_parts(&self, graph: &ModelGraph, op: usize) -> Result<&[LinearPart], EngineError> {
        match self.linear.get(&op) {
            Some(p) if !p.is_empty() => Ok(p),
            _ => Err(missing_op(graph, op)),
        }
    }

    /// The table of `graph`'s embedding op `op`; [`EngineError::MissingTensor`] naming it when it
    /// was not uploaded.
    pub(crate) fn embedding(&self, graph: &ModelGraph, op: usize) -> Result<&Arc<GpuEmbedding>, EngineError> {
        self.embed.get(&op).ok_or_else(|| missing_op(graph, op))
    }
}

/// The missing matrices of op `op`.
fn missing_op(graph: &ModelGraph, op: usize) -> EngineError {
    let name = graph.ops.get(op).map_or_else(|| format!("(the weights of op {op})"), |o| names(&o.mats()));
    EngineError::MissingTensor { name }
}

/// An F32 matrix as F16 (BF16 when a value is beyond f16's range): the GPU's F16/BF16 GEMV and
/// GEMM read half the bytes. Other formats unchanged.
fn narrow_f32(p: Arc<PackedWeights>) -> Result<Arc<PackedWeights>, EngineError> {
    if p.format() != PackedFormat::Ggml(GgmlType::F32) {
        return Ok(p);
    }
    let v = p.dequantize();
    let (ty, bytes): (GgmlType, Vec<u16>) = if v.iter().all(|x| x.abs() <= 65504.0) {
        (GgmlType::F16, v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect())
    } else {
        (GgmlType::BF16, v.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect())
    };
    let narrowed = repack(ty, bytemuck::cast_slice(&bytes), p.rows(), p.cols())
        .map_err(|e| EngineError::Unsupported { what: format!("an F32 matrix as {}: {e}", ty.name()) })?;
    Ok(Arc::new(narrowed))
}

fn names(mats: &[&MatRef]) -> String {
    mats.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(" + ")
}

fn quant_err(ctx: &GpuContext, e: boostr::quant::QuantError) -> EngineError {
    match e {
        boostr::quant::QuantError::Gpu(g) => dev_err(ctx, g),
        e => EngineError::Unsupported { what: e.to_string() },
    }
}
