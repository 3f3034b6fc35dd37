//! Pipeline cache: a kernel compiles once per (WGSL source, entry point, checks) and is shared.
//! Bind group layouts are cached by access pattern, and bind groups by the exact buffer ranges
//! they bind, so a repeated op sequence over pooled buffers creates nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::capabilities::ParamMode;
use super::context::GpuContext;
use super::kernel::{Access, KernelSource, MAX_PARAM_WORDS};
use super::pool::GpuBuffer;
use crate::error::{NumrError, Result};

/// A compiled kernel: its pipeline and the layout of its storage bindings.
#[derive(Debug)]
pub struct Kernel {
    /// Shared, so that recording a dispatch labels it without allocating.
    pub(crate) name: Arc<str>,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    pub(crate) layout_key: Vec<Access>,
    pub(crate) param_bytes: u32,
    pub(crate) param_names: Vec<String>,
    pub(crate) param_mode: ParamMode,
    pub(crate) source: KernelSource,
}

impl Kernel {
    /// The source the kernel was compiled from.
    pub fn source(&self) -> &KernelSource {
        &self.source
    }

    /// The kernel's label (from [`KernelSource::name`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The word index of parameter `name`.
    pub fn param_index(&self, name: &str) -> Option<usize> {
        self.param_names.iter().position(|p| p == name)
    }

    /// The parameter names in word order.
    pub fn param_names(&self) -> &[String] {
        &self.param_names
    }

    /// Parameter words the kernel reads (padding included).
    pub fn param_words(&self) -> usize {
        self.param_bytes as usize / 4
    }
}

/// One buffer range bound to a kernel binding.
#[derive(Clone, Debug)]
pub struct Binding {
    /// The buffer bound.
    pub buffer: Arc<GpuBuffer>,
    /// Start of the range in bytes; a multiple of the adapter's
    /// `min_storage_buffer_offset_alignment`.
    pub offset: u64,
    /// Length of the range in bytes; a multiple of 4, at most the adapter's binding limit.
    pub size: u64,
}

impl Binding {
    /// The whole buffer.
    pub fn whole(buffer: &Arc<GpuBuffer>) -> Self {
        Binding { buffer: buffer.clone(), offset: 0, size: buffer.len().max(4).div_ceil(4) * 4 }
    }
}

/// A bind group built once and reusable across recordings and submits. It keeps its buffers alive.
#[derive(Clone, Debug)]
pub struct BoundGroup {
    pub(crate) group: wgpu::BindGroup,
    pub(crate) layout_key: Vec<Access>,
    pub(crate) bindings: Vec<Binding>,
}

impl BoundGroup {
    /// The buffer ranges bound, in binding order.
    pub fn bindings(&self) -> &[Binding] {
        &self.bindings
    }
}

type BindKey = (Vec<Access>, Vec<(u64, u64, u64)>);

#[derive(Default)]
pub(crate) struct PipelineCache {
    kernels: Mutex<HashMap<(String, String, bool), Arc<Kernel>>>,
    layouts: Mutex<HashMap<Vec<Access>, wgpu::BindGroupLayout>>,
    arena_layout: Mutex<Option<wgpu::BindGroupLayout>>,
    groups: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
    groups_created: std::sync::atomic::AtomicU64,
}

const BIND_CACHE_MAX: usize = 8192;

impl GpuContext {
    fn storage_layout(&self, access: &[Access]) -> wgpu::BindGroupLayout {
        let mut layouts = self.inner.pipelines.layouts.lock().unwrap_or_else(|p| p.into_inner());
        layouts
            .entry(access.to_vec())
            .or_insert_with(|| {
                let entries: Vec<_> = access
                    .iter()
                    .enumerate()
                    .map(|(i, a)| wgpu::BindGroupLayoutEntry {
                        binding: i as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: *a == Access::Read },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    })
                    .collect();
                self.inner.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries })
            })
            .clone()
    }

    /// The layout of group 1 in [`ParamMode::UniformArena`]: one uniform with a dynamic offset.
    pub(crate) fn arena_layout(&self) -> wgpu::BindGroupLayout {
        let mut l = self.inner.pipelines.arena_layout.lock().unwrap_or_else(|p| p.into_inner());
        l.get_or_insert_with(|| {
            self.inner.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("numr-param-arena"),
                entries: &[wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Uniform, has_dynamic_offset: true, min_binding_size: None },
                    count: None,
                }],
            })
        })
        .clone()
    }

    /// Compiles `src` (or returns the cached pipeline). Checks the binding count and parameter
    /// size against the adapter first, and turns compile failures into typed errors.
    pub fn kernel(&self, src: &KernelSource) -> Result<Arc<Kernel>> {
        let unchecked = src.is_unchecked() || !self.inner.options.runtime_checks.enabled();
        let key = (src.wgsl.clone(), src.entry.clone(), unchecked);
        if let Some(k) = self.inner.pipelines.kernels.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(k.clone());
        }
        let limit = self.inner.caps.limits.max_storage_buffers_per_shader_stage;
        if src.bindings.len() as u32 > limit {
            return Err(NumrError::TooManyBindings { kernel: src.name.clone(), needed: src.bindings.len() as u32, limit });
        }
        if src.param_words as usize > MAX_PARAM_WORDS {
            return Err(NumrError::ParamsTooLarge { kernel: src.name.clone(), needed: src.param_words as usize * 4, limit: MAX_PARAM_WORDS * 4 });
        }
        if src.param_mode != self.inner.caps.param_mode {
            return Err(NumrError::ShaderCompile {
                kernel: src.name.clone(),
                message: format!("generated for {:?} but the context uses {:?}", src.param_mode, self.inner.caps.param_mode),
            });
        }
        let layout = self.storage_layout(&src.bindings);
        let param_bytes = src.param_words * 4;
        let arena = self.arena_layout();
        let dev = &self.inner.device;
        let pipeline = self
            .scoped(&format!("compiling kernel {}", src.name), || {
                let desc = wgpu::ShaderModuleDescriptor { label: Some(&src.name), source: wgpu::ShaderSource::Wgsl(src.wgsl.as_str().into()) };
                let module = if unchecked {
                    // SAFETY: only kernels whose indexing is in bounds by construction opt out of
                    // runtime checks, and their unchecked variants are covered by parity tests.
                    unsafe { dev.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
                } else {
                    dev.create_shader_module(desc)
                };
                let groups: Vec<Option<&wgpu::BindGroupLayout>> = match src.param_mode {
                    ParamMode::Immediates => vec![Some(&layout)],
                    ParamMode::UniformArena => vec![Some(&layout), Some(&arena)],
                };
                let pl = dev.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some(&src.name),
                    bind_group_layouts: &groups,
                    immediate_size: if src.param_mode == ParamMode::Immediates { param_bytes } else { 0 },
                });
                dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&src.name),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some(&src.entry),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        zero_initialize_workgroup_memory: self.inner.options.zero_init_workgroup_memory,
                        ..Default::default()
                    },
                    cache: None,
                })
            })
            .map_err(|e| match e {
                NumrError::Validation { message, .. } | NumrError::Internal { message, .. } => NumrError::ShaderCompile { kernel: src.name.clone(), message },
                other => other,
            })?;
        let k = Arc::new(Kernel {
            name: src.name.as_str().into(),
            pipeline,
            layout,
            layout_key: src.bindings.clone(),
            param_bytes,
            param_names: src.param_names.clone(),
            param_mode: src.param_mode,
            source: src.clone(),
        });
        self.inner.pipelines.kernels.lock().unwrap_or_else(|p| p.into_inner()).insert(key, k.clone());
        Ok(k)
    }

    /// Bind groups created so far (cache misses of [`GpuContext::bind`]): an engine's decode loop
    /// must not move it after the first token.
    pub fn bind_groups_created(&self) -> u64 {
        self.inner.pipelines.groups_created.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of distinct compiled kernels (for tests of the cache).
    pub fn cached_kernels(&self) -> usize {
        self.inner.pipelines.kernels.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Checks one binding against the adapter's limits and alignment rules.
    fn check_binding(&self, b: &Binding) -> Result<()> {
        let limits = &self.inner.caps.limits;
        if b.size > limits.max_storage_buffer_binding_size {
            return Err(NumrError::BindingTooLarge { bytes: b.size, limit: limits.max_storage_buffer_binding_size });
        }
        let align = limits.min_storage_buffer_offset_alignment as u64;
        if !b.offset.is_multiple_of(align) || !b.size.is_multiple_of(4) || b.offset + b.size > b.buffer.capacity() {
            return Err(NumrError::Validation {
                context: "binding a buffer".into(),
                message: format!("range {}+{} of {:?} is misaligned or out of bounds (offset alignment {align})", b.offset, b.size, b.buffer),
            });
        }
        Ok(())
    }

    /// Builds a bind group for `kernel` once; reuse it in any number of recordings.
    pub fn bind(&self, kernel: &Kernel, bindings: &[Binding]) -> Result<BoundGroup> {
        if bindings.len() != kernel.layout_key.len() {
            return Err(NumrError::Validation {
                context: format!("binding kernel {}", kernel.name),
                message: format!("{} bindings given, {} expected", bindings.len(), kernel.layout_key.len()),
            });
        }
        for b in bindings {
            self.check_binding(b)?;
        }
        let key: BindKey = (kernel.layout_key.clone(), bindings.iter().map(|b| (b.buffer.id(), b.offset, b.size)).collect());
        let cached = self.inner.pipelines.groups.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let group = match cached {
            Some(g) => g,
            None => {
                let entries: Vec<_> = bindings
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: b.buffer.raw(),
                            offset: b.offset,
                            size: wgpu::BufferSize::new(b.size),
                        }),
                    })
                    .collect();
                let g = self.scoped(&format!("binding kernel {}", kernel.name), || {
                    self.inner.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &kernel.layout, entries: &entries })
                })?;
                self.inner.pipelines.groups_created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut groups = self.inner.pipelines.groups.lock().unwrap_or_else(|p| p.into_inner());
                if groups.len() >= BIND_CACHE_MAX {
                    groups.clear();
                }
                groups.insert(key, g.clone());
                g
            }
        };
        Ok(BoundGroup { group, layout_key: kernel.layout_key.clone(), bindings: bindings.to_vec() })
    }

    /// Forgets cached bind groups (called when pooled buffers are destroyed).
    #[allow(dead_code)]
    pub(crate) fn clear_bind_cache(&self) {
        self.inner.pipelines.groups.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
