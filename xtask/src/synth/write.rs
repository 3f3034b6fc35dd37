//! Writing the file: the header through [`GgufWriter`], then each tensor in chunks of rows that
//! all cores generate at once (`std::thread::scope`, one slice of rows per thread) while a
//! writer thread streams the previous chunk to disk. At most a few chunks are in memory.
//!
//! Every row's bytes depend only on (seed, tensor index, row), so the file is the same whatever
//! the chunk size or the number of threads.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::mpsc;

use cera::gguf::{GgufWriter, MetadataValue};

use super::blocks::{Rng, fill_row};
use super::tensors::Planned;

/// Bytes generated per chunk (a chunk is whole rows, at least one).
const CHUNK_BYTES: usize = 32 << 20;

/// Fills `out` (whole rows of `row_bytes`, the first being row `first_row`) with tensor `index`'s
/// rows, over `threads` threads.
fn fill_chunk(t: &Planned, index: u64, seed: u64, first_row: u64, out: &mut [u8], row_bytes: usize, threads: usize) {
    let ty = t.desc.ty;
    let cols = t.desc.dims[0] as usize;
    let rows = out.len() / row_bytes;
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (k, part) in out.chunks_mut(per * row_bytes).enumerate() {
            s.spawn(move || {
                for (r, row) in part.chunks_exact_mut(row_bytes).enumerate() {
                    let row_index = first_row + (k * per + r) as u64;
                    let mut rng = Rng::for_row(seed, index, row_index);
                    if t.desc.dims.len() == 1 && ty == boostr::formats::GgmlType::F32 {
                        // A vector (a bias): unit RMS, so that it matters as much as the product.
                        fill_unit_f32(&mut rng, row);
                    } else {
                        fill_row(ty, cols, &mut rng, row);
                    }
                }
            });
        }
    });
}

/// Random F32 values of unit RMS (uniform in `±sqrt(3)`).
fn fill_unit_f32(rng: &mut Rng, out: &mut [u8]) {
    for c in out.chunks_exact_mut(4) {
        let x = (rng.unit() * 2.0 - 1.0) * 3f32.sqrt();
        c.copy_from_slice(&x.to_le_bytes());
    }
}

/// The bytes of an all-ones F32 vector.
fn ones(n: u64) -> Vec<u8> {
    (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect()
}

/// Writes the model to `path`: the metadata `kvs`, then every tensor of `tensors` in order,
/// matrices as random rows from `seed`. Returns the file's size.
pub fn write_model(path: &Path, kvs: &[(String, MetadataValue)], tensors: &[Planned], seed: u64, threads: usize) -> io::Result<u64> {
    let descs: Vec<_> = tensors.iter().map(|t| t.desc.clone()).collect();
    let file = BufWriter::with_capacity(8 << 20, File::create(path)?);
    let mut w = GgufWriter::new(file, 3, kvs, &descs)?;
    // The writer thread takes chunks in order and hands the buffers back for reuse.
    let (to_writer, chunks) = mpsc::sync_channel::<Vec<u8>>(2);
    let (give_back, spare) = mpsc::channel::<Vec<u8>>();
    std::thread::scope(|s| -> io::Result<u64> {
        let writer = s.spawn(move || -> io::Result<GgufWriter<BufWriter<File>>> {
            for chunk in chunks {
                w.write_tensor_data(&chunk)?;
                // The generator may be gone after an error; then the buffer is simply dropped.
                let _ = give_back.send(chunk);
            }
            Ok(w)
        });
        let generate = || -> Result<(), ()> {
            for (index, t) in tensors.iter().enumerate() {
                let n: u64 = t.desc.dims.iter().product();
                if !t.random {
                    to_writer.send(ones(n)).map_err(drop)?;
                    continue;
                }
                let row_bytes = t.desc.ty.bytes_for(t.desc.dims[0] as usize).expect("whole blocks");
                let rows = n / t.desc.dims[0];
                let per_chunk = (CHUNK_BYTES / row_bytes).max(1) as u64;
                let mut first = 0;
                while first < rows {
                    let take = per_chunk.min(rows - first);
                    let mut buf = spare.try_recv().unwrap_or_default();
                    buf.resize(take as usize * row_bytes, 0);
                    fill_chunk(t, index as u64, seed, first, &mut buf, row_bytes, threads);
                    to_writer.send(buf).map_err(drop)?;
                    first += take;
                }
            }
            Ok(())
        };
        let sent = generate();
        drop(to_writer);
        let w = writer.join().expect("writer thread")?;
        // A send fails only if the writer stopped, and then it returned its error above.
        sent.map_err(|()| io::Error::other("the writer stopped"))?;
        let file = w.finish()?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(file.metadata()?.len())
    })
}
