//! Shared helpers of `plans_ops` and `plans_sampling` (uploads, readbacks, tolerances, the
//! serial lock and the allocation counters). Included with `#[path = "plans_ops_util.rs"] mod
//! util;`.
#![allow(dead_code)]

use std::sync::Arc;

use boostr::ops_common::GpuView;
use numr::gpu::{GpuBuffer, GpuContext, Recorder};
use numr::testing::{check_close, test_gpu};
use numr::{DType, Device, Tensor};

pub fn f32_buf(ctx: &GpuContext, v: &[f32]) -> Arc<GpuBuffer> {
    ctx.upload(bytemuck::cast_slice(v)).unwrap()
}
pub fn u32_buf(ctx: &GpuContext, v: &[u32]) -> Arc<GpuBuffer> {
    ctx.upload(bytemuck::cast_slice(v)).unwrap()
}
pub fn zeros(ctx: &GpuContext, words: usize) -> Arc<GpuBuffer> {
    ctx.upload(&vec![0u8; words * 4]).unwrap()
}
pub fn read_f32(ctx: &GpuContext, b: &Arc<GpuBuffer>, words: usize) -> Vec<f32> {
    bytemuck::cast_slice(&ctx.read_bytes(b, 0, words as u64 * 4).unwrap()).to_vec()
}
pub fn read_u32(ctx: &GpuContext, b: &Arc<GpuBuffer>, words: usize) -> Vec<u32> {
    bytemuck::cast_slice(&ctx.read_bytes(b, 0, words as u64 * 4).unwrap()).to_vec()
}
pub fn tensor(ctx: &GpuContext, v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, &Device::Gpu(ctx.clone())).unwrap()
}
pub fn close(got: &[f32], want: &[f32], what: &str) {
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    check_close(&f(got), &f(want), DType::F32).unwrap_or_else(|e| panic!("{what}: {e}"));
}
/// Records a copy of `words` words of `v` into `dst` at word `at`.
pub fn copy_out(rec: &mut Recorder, v: &GpuView, words: usize, dst: &Arc<GpuBuffer>, at: usize) {
    rec.copy(v.buffer(), v.byte_offset(), dst, at as u64 * 4, words as u64 * 4).unwrap();
}
/// Records a copy of `words` words from word `from` of `src` into `dst` at word `at`.
pub fn copy_in(rec: &mut Recorder, src: &Arc<GpuBuffer>, from: usize, dst: &Arc<GpuBuffer>, at: usize, words: usize) {
    rec.copy(src, from as u64 * 4, dst, at as u64 * 4, words as u64 * 4).unwrap();
}

/// The tests share one context (`test_gpu`), and the counters below are the context's: each test
/// holds this lock so that no other test moves them.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn gpu() -> Option<(GpuContext, std::sync::MutexGuard<'static, ()>)> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Some((test_gpu()?, guard))
}

/// The buffer-pool and bind-group counters, which recording and submitting must not move.
pub struct Counters(pub u64, pub u64);
impl Counters {
    pub fn now(ctx: &GpuContext) -> Self {
        Counters(ctx.bind_groups_created(), ctx.pool_stats().created)
    }
    pub fn unchanged(&self, ctx: &GpuContext, what: &str) {
        assert_eq!(ctx.bind_groups_created(), self.0, "{what}: recording created a bind group");
        assert_eq!(ctx.pool_stats().created, self.1, "{what}: recording allocated a buffer");
    }
}

pub const STEPS: [usize; 3] = [1, 3, 7];
