//! What the chosen adapter can do, as a plain struct that kernels and users can inspect.

/// One cooperative-matrix shape the adapter supports (M×N×K, input and accumulator types).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoopMatShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ab: String,
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
    pub adapter_name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub shader_f16: bool,
    pub subgroups: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub timestamps: bool,
    pub timestamps_inside_passes: bool,
    pub immediates: bool,
    /// `@coherent` storage buffers (`wgpu::Features::MEMORY_DECORATION_COHERENT`).
    pub coherent_memory: bool,
    pub cooperative_matrix: Vec<CoopMatShape>,
    pub param_mode: ParamMode,
    pub limits: wgpu::Limits,
}

impl Capabilities {
    pub fn max_buffer_size(&self) -> u64 {
        self.limits.max_buffer_size
    }
    pub fn max_binding_size(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }
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
