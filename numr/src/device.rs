//! Where a tensor lives.

use crate::error::Result;
use crate::gpu::GpuContext;

/// A device: the host CPU, or one wgpu device.
#[derive(Clone, Debug)]
pub enum Device {
    /// Host memory; ops run on the CPU reference paths.
    Cpu,
    /// A wgpu device; the context is shared (cloning it clones an `Arc`).
    Gpu(GpuContext),
}

impl Device {
    /// The GPU chosen by `NUMR_ADAPTER` / `NUMR_BACKEND`, else the best discrete GPU.
    pub fn gpu() -> Result<Device> {
        Ok(Device::Gpu(GpuContext::new()?))
    }

    /// True for [`Device::Gpu`].
    pub fn is_gpu(&self) -> bool {
        matches!(self, Device::Gpu(_))
    }

    /// The GPU context, or `None` on the CPU.
    pub fn gpu_context(&self) -> Option<&GpuContext> {
        match self {
            Device::Gpu(c) => Some(c),
            Device::Cpu => None,
        }
    }

    /// True when both are the CPU or both are the same GPU context.
    pub fn same(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Gpu(a), Device::Gpu(b)) => std::sync::Arc::ptr_eq(&a.inner, &b.inner),
            _ => false,
        }
    }
}
