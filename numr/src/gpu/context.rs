//! [`GpuContext`]: the adapter, device and queue, with the capabilities found, the buffer pool,
//! the pipeline cache and the implicit stream that eager tensor ops record into.

use std::sync::{Arc, Mutex};

use super::capabilities::{Capabilities, CoopMatShape, ParamMode};
use super::pipeline::PipelineCache;
use super::pool::BufferPool;
use super::recorder::{ParamArena, Recording};
use crate::error::{NumrError, Result};

/// How to choose and configure the GPU. `from_env` reads `NUMR_ADAPTER` and `NUMR_BACKEND`; no
/// other environment variable changes behaviour.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// Adapter by case-insensitive name substring, or by index in the enumeration order.
    pub adapter: Option<String>,
    /// Restrict to one backend: "vulkan", "metal", "dx12" or "gl".
    pub backend: Option<String>,
    /// naga's runtime bounds checks in kernels that do not opt out explicitly: on by default;
    /// only the `unsafe` [`RuntimeChecks::off`] turns them off.
    pub runtime_checks: RuntimeChecks,
    /// Force a parameter mode (tests use this to exercise the uniform-arena path).
    pub param_mode: Option<ParamMode>,
    /// Bytes of free buffers the pool may keep for reuse.
    pub pool_limit_bytes: u64,
    /// Have wgpu zero workgroup memory at the start of every workgroup. Off by default: every
    /// kernel in the stack writes workgroup memory before reading it (the parity tests check the
    /// outputs), and the zeroing is a prologue plus a barrier in every workgroup.
    pub zero_init_workgroup_memory: bool,
    /// Do not request the SUBGROUP feature even where the adapter has it, so that
    /// [`Capabilities::subgroups`] is false and every kernel choice takes its subgroup-free path
    /// (tests use this, through `numr::testing::GpuProfile::NoSubgroups` (with the `testing` feature), to run the fallback
    /// kernels on an adapter with subgroups). Off by default.
    pub disable_subgroups: bool,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            adapter: None,
            backend: None,
            runtime_checks: RuntimeChecks::on(),
            param_mode: None,
            pool_limit_bytes: 2 << 30,
            zero_init_workgroup_memory: false,
            disable_subgroups: false,
        }
    }
}

/// Whether a context compiles kernels with naga's runtime bounds checks. Safe code can only keep
/// them on:
/// ```compile_fail
/// let _ = numr::GpuOptions { runtime_checks: numr::gpu::RuntimeChecks(false), ..Default::default() };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeChecks(bool);

impl Default for RuntimeChecks {
    fn default() -> Self {
        RuntimeChecks(true)
    }
}

impl RuntimeChecks {
    /// Checks on (the default).
    pub const fn on() -> Self {
        RuntimeChecks(true)
    }

    /// Compile every kernel of the context without naga's runtime bounds checks.
    ///
    /// # Safety
    /// Every dispatch made through the context must index only inside its bound buffers; an
    /// out-of-bounds access in an unchecked module is undefined behaviour on the GPU.
    pub const unsafe fn off() -> Self {
        RuntimeChecks(false)
    }

    /// Whether the checks are on.
    pub const fn enabled(self) -> bool {
        self.0
    }
}

impl GpuOptions {
    /// The defaults, with [`adapter`](Self::adapter) from `NUMR_ADAPTER` and
    /// [`backend`](Self::backend) from `NUMR_BACKEND` (empty values are ignored).
    pub fn from_env() -> Self {
        GpuOptions {
            adapter: std::env::var("NUMR_ADAPTER").ok().filter(|s| !s.is_empty()),
            backend: std::env::var("NUMR_BACKEND").ok().filter(|s| !s.is_empty()),
            ..Default::default()
        }
    }
}

pub(crate) struct GpuInner {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) caps: Capabilities,
    pub(crate) options: GpuOptions,
    pub(crate) pool: BufferPool,
    pub(crate) pipelines: PipelineCache,
    /// The implicit recording that eager tensor ops append to; submitted on readback or `sync`.
    pub(crate) stream: Mutex<Option<Recording>>,
    pub(crate) arena: Mutex<Option<ParamArena>>,
    pub(crate) submit_lock: Mutex<()>,
    pub(crate) uncaptured: Arc<Mutex<Vec<String>>>,
    /// Readbacks that waited for all queued work ([`GpuContext::read_wait_fallbacks`]).
    pub(crate) read_fallbacks: std::sync::atomic::AtomicU64,
    _adapter: wgpu::Adapter,
    _instance: wgpu::Instance,
}

/// A handle to one GPU device. Cheap to clone; all clones share the pool, caches and stream.
#[derive(Clone)]
pub struct GpuContext {
    pub(crate) inner: Arc<GpuInner>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuContext({})", self.inner.caps.adapter_name)
    }
}

fn backend_of(name: &str) -> Option<wgpu::Backends> {
    match name.to_ascii_lowercase().as_str() {
        "vulkan" | "vk" => Some(wgpu::Backends::VULKAN),
        "metal" | "mtl" => Some(wgpu::Backends::METAL),
        "dx12" | "d3d12" => Some(wgpu::Backends::DX12),
        "gl" | "gles" | "opengl" => Some(wgpu::Backends::GL),
        _ => None,
    }
}

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn backend_rank(b: wgpu::Backend) -> u32 {
    if b == wgpu::Backend::Gl { 1 } else { 0 }
}

/// `index: name (backend, type)`, as [`GpuContext::list_adapters`] prints an adapter.
fn adapter_line(i: usize, info: &wgpu::AdapterInfo) -> String {
    format!("{i}: {} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

fn scalar_name(t: wgpu::CooperativeScalarType) -> String {
    format!("{t:?}").to_ascii_lowercase()
}

impl GpuContext {
    /// Picks the adapter from `NUMR_ADAPTER` / `NUMR_BACKEND`, else the best discrete GPU.
    pub fn new() -> Result<Self> {
        Self::with_options(GpuOptions::from_env())
    }

    /// Lists the adapters wgpu can see, as "index: name (backend, type)"; `NUMR_ADAPTER=<index>`
    /// (or [`GpuOptions::adapter`]) picks by this index.
    pub fn list_adapters() -> Vec<String> {
        let desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        let backends = desc.backends;
        let instance = wgpu::Instance::new(desc);
        pollster::block_on(instance.enumerate_adapters(backends)).iter().enumerate().map(|(i, a)| adapter_line(i, &a.get_info())).collect()
    }

    /// Picks an adapter by `options` (else the best discrete GPU, native backends before GL) and
    /// creates the device with every optional feature numr uses that it has, at the adapter's own
    /// limits. Errors: [`NumrError::NoAdapter`] (none at all),
    /// [`NumrError::AdapterNotFound`] (an adapter asked for that none matches, with those
    /// found), [`NumrError::DeviceCreation`], or
    /// [`NumrError::MissingFeature`] when immediates are forced but unavailable.
    pub fn with_options(options: GpuOptions) -> Result<Self> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if let Some(b) = &options.backend {
            desc.backends = backend_of(b).ok_or_else(|| NumrError::NoAdapter { filter: format!("backend {b}") })?;
        }
        // An index refers to the enumeration `list_adapters` prints (every backend, or the one
        // asked for), so `NUMR_ADAPTER=1` means the adapter listed as `1:`.
        let by_index = options.adapter.as_deref().and_then(|s| s.trim().parse::<usize>().ok());
        // Without an explicit choice, look at the native APIs first (Vulkan, Metal, DX12) and
        // only fall back to GL when none of them has an adapter.
        // (`WGPU_BACKEND` is wgpu's own variable, read by wgpu.)
        let explicit = options.backend.is_some() || wgpu::Backends::from_env().is_some();
        if !explicit && by_index.is_none() {
            desc.backends &= wgpu::Backends::PRIMARY;
        }
        let mut backends = desc.backends;
        let mut instance = wgpu::Instance::new(desc);
        let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
        if adapters.is_empty() && !explicit {
            backends = wgpu::Backends::all();
            instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
            adapters = pollster::block_on(instance.enumerate_adapters(backends));
        }
        // What a filter that matches nothing is told: the adapters that were looked at.
        let listing: Vec<String> = adapters.iter().enumerate().map(|(i, a)| adapter_line(i, &a.get_info())).collect();
        let adapter = match (&options.adapter, by_index) {
            (_, Some(i)) => adapters.into_iter().nth(i),
            (Some(sel), None) => {
                let s = sel.to_ascii_lowercase();
                adapters.into_iter().find(|a| a.get_info().name.to_ascii_lowercase().contains(&s))
            }
            (None, None) => adapters.into_iter().min_by_key(|a| {
                let i = a.get_info();
                (type_rank(i.device_type), backend_rank(i.backend))
            }),
        };
        let adapter = match (adapter, &options.adapter) {
            (Some(a), _) => a,
            (None, Some(sel)) => return Err(NumrError::AdapterNotFound { filter: sel.clone(), found: listing }),
            (None, None) => return Err(NumrError::NoAdapter { filter: options.backend.as_ref().map(|b| format!("backend {b}")).unwrap_or_default() }),
        };

        let info = adapter.get_info();
        let have = adapter.features();
        let wanted = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::IMMEDIATES
            | wgpu::Features::MEMORY_DECORATION_COHERENT
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        let mut features = have & wanted;
        if options.disable_subgroups {
            features.remove(wgpu::Features::SUBGROUP);
        }
        // Inside-pass timestamps are only valid together with the base feature.
        if !features.contains(wgpu::Features::TIMESTAMP_QUERY) {
            features.remove(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS);
        }
        let limits = adapter.limits();
        let coop = if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) { adapter.cooperative_matrix_properties() } else { Vec::new() };
        let device_desc = wgpu::DeviceDescriptor {
            label: Some("numr"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: the only experimental feature requested is cooperative matrices; kernels that
            // use them are checked against the CPU reference in the test suite.
            experimental_features: if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&device_desc))
            .map_err(|e| NumrError::DeviceCreation { adapter: info.name.clone(), reason: e.to_string() })?;

        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));

        let immediates = features.contains(wgpu::Features::IMMEDIATES) && limits.max_immediate_size >= 128;
        let param_mode = options.param_mode.unwrap_or(if immediates { ParamMode::Immediates } else { ParamMode::UniformArena });
        if param_mode == ParamMode::Immediates && !immediates {
            return Err(NumrError::MissingFeature("IMMEDIATES (128 bytes)"));
        }
        let caps = Capabilities {
            adapter_name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_inside_passes: features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            immediates,
            coherent_memory: features.contains(wgpu::Features::MEMORY_DECORATION_COHERENT),
            cooperative_matrix: coop
                .iter()
                .map(|c| CoopMatShape { m: c.m_size, n: c.n_size, k: c.k_size, ab: scalar_name(c.ab_type), cr: scalar_name(c.cr_type) })
                .collect(),
            param_mode,
            limits,
        };
        let pool = BufferPool::new(options.pool_limit_bytes);
        Ok(GpuContext {
            inner: Arc::new(GpuInner {
                device,
                queue,
                caps,
                options,
                pool,
                pipelines: PipelineCache::default(),
                stream: Mutex::new(None),
                arena: Mutex::new(None),
                submit_lock: Mutex::new(()),
                uncaptured,
                read_fallbacks: Default::default(),
                _adapter: adapter,
                _instance: instance,
            }),
        })
    }

    /// What the adapter and device can do.
    pub fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }
    /// The options the context was created with.
    pub fn options(&self) -> &GpuOptions {
        &self.inner.options
    }
    /// The raw wgpu device, for code that builds its own wgpu objects.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device
    }
    /// The raw wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.queue
    }

    /// Runs `f` inside out-of-memory and validation error scopes and turns what they catch into a
    /// typed error. `context` says what was being done, for the message.
    pub fn scoped<T>(&self, context: &str, f: impl FnOnce() -> T) -> Result<T> {
        let dev = &self.inner.device;
        let oom = dev.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = dev.push_error_scope(wgpu::ErrorFilter::Internal);
        let out = f();
        let e_int = resolve(internal.pop());
        let e_val = resolve(val.pop());
        let e_oom = resolve(oom.pop());
        if e_oom.is_some() {
            return Err(NumrError::OutOfMemory { context: context.to_string() });
        }
        if let Some(e) = e_val {
            return Err(NumrError::Validation { context: context.to_string(), message: e.to_string() });
        }
        if let Some(e) = e_int {
            return Err(NumrError::Internal { context: context.to_string(), message: e.to_string() });
        }
        self.take_uncaptured(context)?;
        Ok(out)
    }

    /// Reports an error that reached the uncaptured handler (for example from another thread).
    pub(crate) fn take_uncaptured(&self, context: &str) -> Result<()> {
        let mut v = self.inner.uncaptured.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(msg) = v.drain(..).next() {
            return Err(NumrError::Validation { context: context.to_string(), message: msg });
        }
        Ok(())
    }

    /// Blocks until the GPU has finished all submitted work.
    pub fn wait_idle(&self) -> Result<()> {
        self.poll(wgpu::PollType::wait_indefinitely())
    }

    /// Polls the device (running the callbacks of finished work); a lost device is a typed error.
    pub(crate) fn poll(&self, kind: wgpu::PollType) -> Result<()> {
        self.inner.device.poll(kind).map(|_| ()).map_err(|e| NumrError::DeviceLost(e.to_string()))
    }
}

/// The output of `fut`: polled once in place (a native adapter's error scope is ready at once),
/// else blocked on. Unlike `pollster::block_on` alone, the ready case allocates nothing.
fn resolve<F: std::future::Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => pollster::block_on(fut),
    }
}
