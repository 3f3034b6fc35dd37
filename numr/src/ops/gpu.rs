//! GPU implementations of the core ops: bind each view's byte range (at the adapter's offset
//! alignment, with the remaining element offset as a parameter), pick the kernel variant, and
//! record it into the context's stream.

use crate::dtype::DType;
use crate::error::{NumrError, Result};
use crate::gpu::{Binding, GpuContext, KernelEnv, grid_2d};
use crate::kernels::binary::{Binary, BinaryOp};
use crate::kernels::convert::{Convert, ConvertMode, MAX_RANK, WG};
use crate::kernels::matmul::{Matmul, TILE};
use crate::kernels::reduce::{RowOp, RowReduce};
use crate::tensor::Tensor;

use super::{check_binary, matmul_dims, row_len};

/// `v` as a kernel parameter word, or [`NumrError::SizeOverflow`].
pub(crate) fn word(op: &'static str, what: &'static str, v: impl TryInto<u32> + Copy + Into<u64>) -> Result<u32> {
    v.try_into().map_err(|_| NumrError::SizeOverflow { op, what, value: v.into() })
}

fn usize_word(op: &'static str, what: &'static str, v: usize) -> Result<u32> {
    word(op, what, v as u64)
}

/// The context of a GPU tensor ([`NumrError::WrongDevice`] for a CPU tensor).
fn ctx_of<'a>(t: &'a Tensor, op: &'static str) -> Result<&'a GpuContext> {
    t.device.gpu_context().ok_or(NumrError::WrongDevice { op, expected: "GPU", got: "CPU" })
}

/// The binding of a view's bytes, and the element offset of its first element inside it.
/// `granule` is the byte multiple the binding size is rounded up to (4, or 16 for vec4 access).
pub(crate) fn bind_view(t: &Tensor, granule: u64) -> Result<(Binding, u32)> {
    let ctx = ctx_of(t, "binding a view")?;
    let buf = t.gpu_buffer().ok_or(NumrError::WrongDevice { op: "binding a view", expected: "GPU", got: "CPU" })?.clone();
    let s = t.dtype.size() as u64;
    let start = t.layout.offset() as u64 * s;
    let end = (t.layout.storage_extent() as u64 * s).max(start + 1);
    let align = ctx.capabilities().limits.min_storage_buffer_offset_alignment as u64;
    let bind_start = start / align * align;
    let size = (end - bind_start).div_ceil(granule) * granule;
    let elem_off = (start - bind_start) / s;
    Ok((Binding { buffer: buf, offset: bind_start, size }, word("binding a view", "element offset", elem_off)?))
}

fn binding_fits(b: &Binding) -> bool {
    b.offset + b.size <= b.buffer.capacity()
}

/// Merges adjacent dims that are contiguous with each other in every stride set, and drops size-1
/// dims, so that most views fit the kernels' six dims.
fn collapse(shape: &[usize], strides: &[&[usize]]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty() && strides.iter().enumerate().all(|(i, st)| *out_strides[i].last().unwrap() == st[d] * shape[d]);
        if mergeable {
            *out_shape.last_mut().unwrap() *= shape[d];
            for (i, st) in strides.iter().enumerate() {
                *out_strides[i].last_mut().unwrap() = st[d];
            }
        } else {
            out_shape.push(shape[d]);
            for (i, st) in strides.iter().enumerate() {
                out_strides[i].push(st[d]);
            }
        }
    }
    (out_shape, out_strides)
}

/// Right-aligns shape and strides into [`MAX_RANK`] dims (leading dims of size 1, stride 0).
fn pad6(op: &'static str, shape: &[usize], strides: &[Vec<usize>]) -> Result<(Vec<u32>, Vec<Vec<u32>>)> {
    if shape.len() > MAX_RANK {
        return Err(NumrError::InvalidView { op, reason: format!("view needs {} strided dims, at most {MAX_RANK} are supported", shape.len()) });
    }
    let lead = MAX_RANK - shape.len();
    let mut d = vec![1u32; lead];
    for &x in shape {
        d.push(usize_word(op, "dimension", x)?);
    }
    let mut st = Vec::with_capacity(strides.len());
    for s in strides {
        let mut v = vec![0u32; lead];
        for &x in s {
            v.push(usize_word(op, "stride", x)?);
        }
        st.push(v);
    }
    Ok((d, st))
}

fn grid_for(ctx: &GpuContext, workgroups: u64) -> Result<[u32; 3]> {
    let max = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
    grid_2d(workgroups, max).ok_or(NumrError::GridTooLarge { workgroups, limit: max })
}

/// Records a contiguous copy of the view `t` in `dtype` into the stream (a vec4 copy when the dtype
/// is kept and the source is contiguous and 16-byte aligned). A CPU tensor is
/// [`NumrError::WrongDevice`].
pub fn convert(t: &Tensor, dtype: DType) -> Result<Tensor> {
    let ctx = ctx_of(t, "convert")?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let out = Tensor::gpu_empty(ctx, t.shape(), dtype)?;
    let n = t.numel();
    if n == 0 {
        return Ok(out);
    }
    let (out_bind, _) = bind_view(&out, 16)?;
    if dtype == t.dtype && t.is_contiguous() {
        let (src_bind, off) = bind_view(t, 16)?;
        let off_bytes = off as u64 * dtype.size() as u64;
        if off_bytes.is_multiple_of(16) && binding_fits(&src_bind) && binding_fits(&out_bind) {
            let n_vec4 = (n as u64 * dtype.size() as u64).div_ceil(16);
            let k = ctx.kernel(&Convert { src: dtype, dst: dtype, mode: ConvertMode::Vec4Copy }.source(&env))?;
            let grid = grid_for(ctx, n_vec4.div_ceil(WG as u64))?;
            ctx.with_stream(|rec| {
                rec.dispatch_with(&k, &[src_bind, out_bind], &[word("copy", "vec4 count", n_vec4)?, word("copy", "offset", off_bytes / 16)?], grid)
            })?;
            return Ok(out);
        }
    }
    let (src_bind, off) = bind_view(t, 4)?;
    let (out_bind, _) = bind_view(&out, 4)?;
    let mode = if t.is_contiguous() { ConvertMode::Contiguous } else { ConvertMode::Strided };
    let (shape, strides) = collapse(t.shape(), &[t.layout.strides()]);
    let (d, st) = pad6("convert", &shape, &strides)?;
    let mut params = vec![usize_word("convert", "element count", n)?, off];
    params.extend(&d);
    params.extend(&st[0]);
    let k = ctx.kernel(&Convert { src: t.dtype, dst: dtype, mode }.source(&env))?;
    let words = (n as u64).div_ceil(dtype.per_word() as u64);
    let grid = grid_for(ctx, words.div_ceil(WG as u64))?;
    ctx.with_stream(|rec| rec.dispatch_with(&k, &[src_bind, out_bind], &params, grid))?;
    Ok(out)
}

/// Records `op(a, b)` elementwise over views of one shape (`b` is `None` for [`BinaryOp::Scale`],
/// which uses `s`); the [`Tensor`] methods check dtypes and broadcast first. Typed errors for a
/// CPU tensor, a missing or extra `b`, or a `b` of another device, dtype or shape.
pub fn binary(a: &Tensor, b: Option<&Tensor>, op: BinaryOp, s: f64) -> Result<Tensor> {
    check_binary(a, b, op)?;
    let ctx = ctx_of(a, "elementwise")?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let out = Tensor::gpu_empty(ctx, a.shape(), a.dtype)?;
    let n = a.numel();
    if n == 0 {
        return Ok(out);
    }
    let (a_bind, a_off) = bind_view(a, 4)?;
    let mut strides: Vec<&[usize]> = vec![a.layout.strides()];
    let mut bindings = vec![a_bind];
    let mut b_off = 0;
    if let Some(b) = b {
        let (bb, bo) = bind_view(b, 4)?;
        bindings.push(bb);
        b_off = bo;
        strides.push(b.layout.strides());
    }
    let (shape, st) = collapse(a.shape(), &strides);
    let (d, st) = pad6("elementwise", &shape, &st)?;
    let scalar = match a.dtype {
        DType::I32 => (s as i32) as u32,
        DType::U32 => s as u32,
        _ => (s as f32).to_bits(),
    };
    let mut params = vec![usize_word("elementwise", "element count", n)?, scalar, a_off, b_off];
    params.extend(&d);
    for s in &st {
        params.extend(s);
    }
    bindings.push(bind_view(&out, 4)?.0);
    let k = ctx.kernel(&Binary { op, dtype: a.dtype }.source(&env))?;
    let words = (n as u64).div_ceil(a.dtype.per_word() as u64);
    let grid = grid_for(ctx, words.div_ceil(WG as u64))?;
    ctx.with_stream(|rec| rec.dispatch_with(&k, &bindings, &params, grid))?;
    Ok(out)
}

/// Records `op` over the last axis of `t` (made contiguous first), computed in f32 and cast back to
/// `t`'s dtype: the axis is removed for sum and max, kept for softmax. A CPU tensor or a scalar
/// is a typed error.
pub fn row_op(t: &Tensor, op: RowOp) -> Result<Tensor> {
    let ctx = ctx_of(t, "row op")?;
    let n = row_len(t, "row op")?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let t = if t.is_contiguous() { t.clone() } else { t.contiguous()? };
    let rows = t.numel().checked_div(n).unwrap_or(0);
    let shape = match op {
        RowOp::Softmax => t.shape().to_vec(),
        _ => t.shape()[..t.rank() - 1].to_vec(),
    };
    let out = Tensor::gpu_empty(ctx, &shape, DType::F32)?;
    if rows > 0 {
        let (x_bind, off) = bind_view(&t, 4)?;
        let (o_bind, _) = bind_view(&out, 4)?;
        let k = ctx.kernel(&RowReduce { op, dtype: t.dtype }.source(&env))?;
        let grid = grid_for(ctx, rows as u64)?;
        ctx.with_stream(|rec| {
            rec.dispatch_with(&k, &[x_bind, o_bind], &[usize_word("row op", "rows", rows)?, usize_word("row op", "row length", n)?, off], grid)
        })?;
    }
    out.cast(t.dtype)
}

/// Records the tiled matmul of `a: [B, M, K]` and `b: [B, K, N]` (F32 or F16, possibly strided
/// or broadcast views) into `[B, M, N]` of `a`'s dtype. Typed errors for CPU tensors, other
/// ranks or dtypes, and shapes that do not chain ([`Tensor::matmul`] reshapes and broadcasts).
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (batch, m, k, n) = matmul_dims(a, b)?;
    let ctx = ctx_of(a, "matmul")?;
    let env = KernelEnv::from_caps(ctx.capabilities());
    let out_f16 = a.dtype == DType::F16 && env.f16;
    let out_dtype = if out_f16 { DType::F16 } else { DType::F32 };
    let out = Tensor::gpu_empty(ctx, &[batch, m, n], out_dtype)?;
    if batch * m * n > 0 {
        let (ab, a_off) = bind_view(a, 4)?;
        let (bb, b_off) = bind_view(b, 4)?;
        let (ob, _) = bind_view(&out, 4)?;
        let (sa, sb) = (a.layout.strides(), b.layout.strides());
        let mut params = [0u32; 11];
        for (p, x) in params.iter_mut().zip([m, n, k, a_off as usize, sa[0], sa[1], sa[2], b_off as usize, sb[0], sb[1], sb[2]]) {
            *p = usize_word("matmul", "size or stride", x)?;
        }
        // f16: read one u32 word (two adjacent f16) per tile-load step when A is contiguous along K,
        // B along N, and every other stride and offset is even (so pairs never straddle words).
        let even = |x: usize| x.is_multiple_of(2);
        let pair_loads =
            a.dtype == DType::F16 && sa[2] == 1 && sb[2] == 1 && [a_off as usize, sa[0], sa[1], b_off as usize, sb[0], sb[1]].into_iter().all(even);
        let cfg = Matmul { out_f16, pair_loads, unrolled_store: true, ..Matmul::new(a.dtype) };
        let kern = ctx.kernel(&cfg.source(&env))?;
        let max = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let grid = [params[1].div_ceil(TILE), params[0].div_ceil(TILE), usize_word("matmul", "batch", batch)?];
        if grid.iter().any(|&g| g > max) {
            return Err(NumrError::GridTooLarge { workgroups: grid.iter().map(|&g| g as u64).product(), limit: max });
        }
        ctx.with_stream(|rec| rec.dispatch_with(&kern, &[ab, bb, ob], &params, grid))?;
    }
    out.cast(a.dtype)
}
