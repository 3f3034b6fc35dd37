//! What the chosen adapter can do, as a plain struct that kernels and users can inspect.

/// One cooperative-matrix shape the adapter supports (M×N×K, input and accumulator types).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoopMatShape {
    /// Rows of the A and C/R matrices.
    pub m: u32,
    /// Columns of the B and C/R matrices.
    pub n: u32,
    /// Columns of A, rows of B (the reduction depth).
    pub k: u32,
    /// Scalar type of the A and B inputs as a WGSL name (`"f16"`, `"f32"`, ...).
    pub ab: String,
    /// Scalar type of the C accumulator and R result as a WGSL name.
    pub cr: String,
}

/// How small per-dispatch parameters reach a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamMode {
    /// Immediates (push constants): `var<immediate>`, set per dispatch. Native only.
    Immediates,
    /// One uniform arena per recording, bound with a dynamic offset per dispatch.
    UniformArena,
}

/// Adapter identity, enabled features and the limits the device was created with.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// The adapter's name as wgpu reports it.
    pub adapter_name: String,
    /// The backend, as wgpu's `Debug` form (`"Vulkan"`, `"Metal"`, `"Dx12"`, `"Gl"`).
    pub backend: String,
    /// `wgpu::DeviceType` as its `Debug` form (`"DiscreteGpu"`, `"Cpu"`, ...).
    pub device_type: String,
    /// Driver name and driver info, space-separated.
    pub driver: String,
    /// `SHADER_F16` is enabled: kernels may use `f16` arithmetic (`enable f16;`).
    pub shader_f16: bool,
    /// `SUBGROUP` is enabled: kernels may use subgroup operations.
    pub subgroups: bool,
    /// Smallest subgroup size the adapter may run with (lanes).
    pub subgroup_min_size: u32,
    /// Largest subgroup size the adapter may run with (lanes).
    pub subgroup_max_size: u32,
    /// `TIMESTAMP_QUERY` is enabled (GPU timing in the profiler).
    pub timestamps: bool,
    /// `TIMESTAMP_QUERY_INSIDE_PASSES` is enabled (a timestamp per dispatch, not only per pass).
    pub timestamps_inside_passes: bool,
    /// `IMMEDIATES` is enabled with at least 128 bytes, so [`ParamMode::Immediates`] is possible.
    pub immediates: bool,
    /// `@coherent` storage buffers (`wgpu::Features::MEMORY_DECORATION_COHERENT`).
    pub coherent_memory: bool,
    /// Cooperative-matrix shapes the adapter supports; empty without the experimental feature.
    pub cooperative_matrix: Vec<CoopMatShape>,
    /// How this context passes kernel parameters.
    pub param_mode: ParamMode,
    /// The limits the device was created with (the adapter's own limits).
    pub limits: wgpu::Limits,
}

impl Capabilities {
    /// `limits.max_buffer_size`, in bytes.
    pub fn max_buffer_size(&self) -> u64 {
        self.limits.max_buffer_size
    }
    /// `limits.max_storage_buffer_binding_size`, in bytes: the largest storage view one binding can
    /// hold.
    pub fn max_binding_size(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }
    /// True when a 16x16x16 cooperative matrix with f16 inputs and an f32 accumulator is supported.
    pub fn has_coopmat_f16_16x16x16(&self) -> bool {
        self.cooperative_matrix.iter().any(|c| c.m == 16 && c.n == 16 && c.k == 16 && c.ab == "f16" && c.cr == "f32")
    }
}

impl std::fmt::Display for Capabilities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = &self.limits;
        writeln!(f, "adapter:      {} ({}, {}, driver {})", self.adapter_name, self.backend, self.device_type, self.driver)?;
        writeln!(f, "shader-f16:   {}", self.shader_f16)?;
        writeln!(f, "subgroups:    {} (size {}..{})", self.subgroups, self.subgroup_min_size, self.subgroup_max_size)?;
        writeln!(f, "timestamps:   {} (inside passes: {})", self.timestamps, self.timestamps_inside_passes)?;
        writeln!(f, "immediates:   {} ({} bytes); params via {:?}", self.immediates, l.max_immediate_size, self.param_mode)?;
        let cm: Vec<String> = self.cooperative_matrix.iter().map(|c| format!("{}x{}x{} {}->{}", c.m, c.n, c.k, c.ab, c.cr)).collect();
        writeln!(f, "coop-matrix:  {}", if cm.is_empty() { "none".to_string() } else { cm.join(", ") })?;
        writeln!(f, "max buffer:   {} bytes", l.max_buffer_size)?;
        writeln!(f, "max binding:  {} bytes (storage), {} bytes (uniform)", l.max_storage_buffer_binding_size, l.max_uniform_buffer_binding_size)?;
        writeln!(f, "storage bufs: {} per stage", l.max_storage_buffers_per_shader_stage)?;
        writeln!(
            f,
            "workgroup:    {} bytes shared, {} invocations, {} groups per dim",
            l.max_compute_workgroup_storage_size, l.max_compute_invocations_per_workgroup, l.max_compute_workgroups_per_dimension
        )
    }
}
