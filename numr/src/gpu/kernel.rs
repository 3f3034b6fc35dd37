//! Kernel sources: a small builder that emits the binding and parameter declarations of a WGSL
//! compute kernel from one description, so the names, the bind group layout and the parameter
//! block can never disagree. Kernel families (in numr and boostr) generate the body.

use std::sync::Arc;

use super::capabilities::{Capabilities, ParamMode};

/// How a kernel accesses one storage binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
}

/// Most parameter words a kernel may take (128 bytes: the immediates size Vulkan guarantees).
pub const MAX_PARAM_WORDS: usize = 32;

/// What a kernel generator needs to know about the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelEnv {
    /// How parameters reach the kernel (`var<immediate>` or a uniform at group 1).
    pub param_mode: ParamMode,
    /// `enable f16;` and `array<f16>` storage are available.
    pub f16: bool,
    /// Subgroup builtins are available.
    pub subgroups: bool,
    /// The subgroup size kernels may assume as a minimum (1 when unknown).
    pub subgroup_min_size: u32,
    /// `@coherent` storage is available (`wgpu::Features::MEMORY_DECORATION_COHERENT`).
    pub coherent: bool,
}

impl KernelEnv {
    /// The environment of an adapter. Subgroups count as available only when the minimum
    /// subgroup size is at least 4.
    pub fn from_caps(c: &Capabilities) -> Self {
        KernelEnv {
            param_mode: c.param_mode,
            f16: c.shader_f16,
            subgroups: c.subgroups && c.subgroup_min_size >= 4,
            subgroup_min_size: c.subgroup_min_size.max(1),
            coherent: c.coherent_memory,
        }
    }

    /// Environments that kernel generators are validated against without a GPU.
    pub fn all_for_validation() -> Vec<KernelEnv> {
        let mut v = Vec::new();
        for param_mode in [ParamMode::Immediates, ParamMode::UniformArena] {
            for f16 in [false, true] {
                for (subgroups, sg) in [(false, 1), (true, 8), (true, 32)] {
                    for coherent in [false, true] {
                        v.push(KernelEnv { param_mode, f16, subgroups, subgroup_min_size: sg, coherent });
                    }
                }
            }
        }
        v
    }
}

/// A complete kernel: WGSL text plus the layout facts the pipeline needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// Human-readable label (used in errors and profiles).
    pub name: String,
    /// The complete WGSL module.
    pub wgsl: String,
    /// The compute entry point's name (`main` for builder kernels).
    pub entry: String,
    /// Storage bindings of group 0, in binding order.
    pub bindings: Vec<Access>,
    /// Parameter words (u32) the kernel reads as `p.<name>`.
    pub param_words: u32,
    /// The parameter names, in word order (padding words excluded). Plans fill parameters by
    /// these names, never by position.
    pub param_names: Vec<String>,
    /// The parameter mode the WGSL was generated for; it must match the context's.
    pub param_mode: ParamMode,
    /// Compile without naga's runtime bounds checks: only set through the `unsafe`
    /// [`KernelSource::assume_in_bounds`] (or [`KernelBuilder::unchecked`]).
    unchecked: bool,
    /// The pieces the builder assembled (for [`mod@super::chain`], which fuses kernels); `None` for
    /// hand-written modules.
    pub parts: Option<Arc<KernelParts>>,
}

/// What a [`KernelBuilder`] assembled a kernel from: its declarations, prelude and body, kept so
/// that [`mod@super::chain`] can put several kernels into one module.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelParts {
    /// `enable f16;` was emitted.
    pub f16: bool,
    /// Other `enable` directives.
    pub enables: Vec<String>,
    /// Storage bindings in binding order: name, access, WGSL type, `@coherent`.
    pub bindings: Vec<(String, Access, String, bool)>,
    /// Parameter names (padding excluded).
    pub params: Vec<String>,
    /// Module-scope WGSL.
    pub prelude: String,
    /// The body of `fn main`.
    pub body: String,
    /// `@workgroup_size`.
    pub workgroup: [u32; 3],
    /// `main` takes the subgroup builtins.
    pub subgroup_builtins: bool,
}

impl KernelSource {
    /// Whether the module is compiled without naga's runtime bounds checks.
    pub fn is_unchecked(&self) -> bool {
        self.unchecked
    }

    /// The same kernel, compiled without naga's runtime bounds checks (faster hot loops).
    ///
    /// # Safety
    /// Every dispatch of the kernel must index only inside its bound buffers: the caller (a plan
    /// that validated the buffer sizes and parameters it binds) guarantees it. An out-of-bounds
    /// access in an unchecked module is undefined behaviour on the GPU.
    pub unsafe fn assume_in_bounds(mut self) -> Self {
        self.unchecked = true;
        self
    }

    /// The word index of parameter `name`.
    pub fn param_index(&self, name: &str) -> Option<usize> {
        self.param_names.iter().position(|p| p == name)
    }
}

/// Builds a [`KernelSource`].
pub struct KernelBuilder {
    name: String,
    env: KernelEnv,
    f16: bool,
    enables: Vec<String>,
    bindings: Vec<(String, Access, String)>,
    params: Vec<String>,
    prelude: String,
    body: String,
    workgroup: [u32; 3],
    unchecked: bool,
    subgroup_builtins: bool,
    coherent: Vec<bool>,
}

impl KernelBuilder {
    /// A builder for kernel `name` (its label) targeting `env`; workgroup size 64x1x1 until
    /// [`Self::workgroup`] changes it.
    pub fn new(name: impl Into<String>, env: KernelEnv) -> Self {
        KernelBuilder {
            name: name.into(),
            env,
            f16: false,
            enables: Vec::new(),
            bindings: Vec::new(),
            params: Vec::new(),
            prelude: String::new(),
            body: String::new(),
            workgroup: [64, 1, 1],
            unchecked: false,
            subgroup_builtins: false,
            coherent: Vec::new(),
        }
    }

    /// Emits `enable f16;` (the caller must check `env.f16`).
    pub fn enable_f16(mut self) -> Self {
        self.f16 = true;
        self
    }

    /// Emits `enable <ext>;` (for example `wgpu_cooperative_matrix`).
    pub fn enable(mut self, ext: &str) -> Self {
        self.enables.push(ext.to_string());
        self
    }

    /// Adds storage binding `name: ty` (for example `array<u32>`) at the next binding index.
    pub fn storage(mut self, name: &str, access: Access, ty: &str) -> Self {
        self.bindings.push((name.to_string(), access, ty.to_string()));
        self.coherent.push(false);
        self
    }

    /// Adds a read-write storage binding declared `@coherent` (needs
    /// `wgpu::Features::MEMORY_DECORATION_COHERENT`, see [`KernelEnv::coherent`]): its stores are
    /// made visible at device scope, so that together with a device-scope barrier another
    /// workgroup of the same dispatch can read them.
    pub fn storage_coherent(mut self, name: &str, ty: &str) -> Self {
        self.bindings.push((name.to_string(), Access::ReadWrite, ty.to_string()));
        self.coherent.push(true);
        self
    }

    /// Adds u32 parameters, read in WGSL as `p.<name>`.
    pub fn params(mut self, names: &[&str]) -> Self {
        self.params.extend(names.iter().map(|s| s.to_string()));
        self
    }

    /// Sets `@workgroup_size(x, y, z)`.
    pub fn workgroup(mut self, x: u32, y: u32, z: u32) -> Self {
        self.workgroup = [x, y, z];
        self
    }

    /// Module-scope WGSL (helper functions, `var<workgroup>` arrays, constants).
    pub fn prelude(mut self, s: &str) -> Self {
        self.prelude.push_str(s);
        self.prelude.push('\n');
        self
    }

    /// Body of `fn main`. In scope: `gid`, `lid`, `wid` (`vec3<u32>` global/local/workgroup ids),
    /// `nwg` (number of workgroups), `lidx` (local index), `wg_linear` (linear workgroup index over
    /// a 2-D grid) and, after [`Self::subgroup_builtins`], `sg_size`, `sg_id` (the invocation's
    /// index in its subgroup), `sg_idx` (the subgroup's index in the workgroup) and `sg_count`
    /// (subgroups in the workgroup). Neither WGSL nor Vulkan promises that `lidx / sg_size` is the
    /// subgroup index, so kernels use `sg_idx` and `sg_count`.
    pub fn body(mut self, s: &str) -> Self {
        self.body.push_str(s);
        self
    }

    /// Adds `sg_size`, `sg_id`, `sg_idx` and `sg_count` (see [`Self::body`]) to `main`'s
    /// arguments, when `env.subgroups` is set.
    pub fn subgroup_builtins(mut self) -> Self {
        self.subgroup_builtins = self.env.subgroups;
        self
    }

    /// Compiles the kernel without naga's runtime bounds checks when `on`.
    ///
    /// # Safety
    /// As [`KernelSource::assume_in_bounds`]: every dispatch must index inside its buffers.
    ///
    /// Safe code cannot reach it:
    /// ```compile_fail
    /// # use numr::gpu::{KernelBuilder, KernelEnv};
    /// fn f(env: KernelEnv) { let _ = KernelBuilder::new("k", env).unchecked(true); }
    /// ```
    pub unsafe fn unchecked(mut self, on: bool) -> Self {
        self.unchecked = on;
        self
    }

    /// Emits the WGSL: enables, bindings of group 0 in the order added, the `Params` struct
    /// (u32 words, padded to a multiple of four), the prelude and `fn main` around the body.
    pub fn build(self) -> KernelSource {
        let mut w = String::new();
        if self.f16 {
            w.push_str("enable f16;\n");
        }
        for e in &self.enables {
            w.push_str(&format!("enable {e};\n"));
        }
        for (i, (name, access, ty)) in self.bindings.iter().enumerate() {
            let a = match access {
                Access::Read => "read",
                Access::ReadWrite => "read_write",
            };
            let coherent = if self.coherent[i] { "@coherent " } else { "" };
            w.push_str(&format!("{coherent}@group(0) @binding({i}) var<storage, {a}> {name}: {ty};\n"));
        }
        // The parameter block is padded to 16 bytes so it is also a valid uniform struct.
        let mut words = self.params.clone();
        while words.is_empty() || !words.len().is_multiple_of(4) {
            words.push(format!("_pad{}", words.len()));
        }
        w.push_str("struct Params {\n");
        for p in &words {
            w.push_str(&format!("    {p}: u32,\n"));
        }
        w.push_str("}\n");
        match self.env.param_mode {
            ParamMode::Immediates => w.push_str("var<immediate> p: Params;\n"),
            ParamMode::UniformArena => w.push_str("@group(1) @binding(0) var<uniform> p: Params;\n"),
        }
        w.push_str(&self.prelude);
        let [x, y, z] = self.workgroup;
        let sg = if self.subgroup_builtins {
            ",\n    @builtin(subgroup_size) sg_size: u32,\n    @builtin(subgroup_invocation_id) sg_id: u32,\n    @builtin(subgroup_id) sg_idx: u32,\n    @builtin(num_subgroups) sg_count: u32"
        } else {
            ""
        };
        w.push_str(&format!(
            "@compute @workgroup_size({x}, {y}, {z})\nfn main(\n    @builtin(global_invocation_id) gid: vec3<u32>,\n    @builtin(local_invocation_id) lid: vec3<u32>,\n    @builtin(local_invocation_index) lidx: u32,\n    @builtin(workgroup_id) wid: vec3<u32>,\n    @builtin(num_workgroups) nwg: vec3<u32>{sg}\n) {{\n    let wg_linear = wid.y * nwg.x + wid.x;\n{}\n}}\n",
            self.body
        ));
        let parts = KernelParts {
            f16: self.f16,
            enables: self.enables,
            bindings: self.bindings.iter().zip(&self.coherent).map(|((n, a, t), &c)| (n.clone(), *a, t.clone(), c)).collect(),
            params: self.params.clone(),
            prelude: self.prelude,
            body: self.body,
            workgroup: self.workgroup,
            subgroup_builtins: self.subgroup_builtins,
        };
        KernelSource {
            name: self.name,
            wgsl: w,
            entry: "main".to_string(),
            bindings: self.bindings.iter().map(|b| b.1).collect(),
            param_words: words.len() as u32,
            param_names: self.params,
            param_mode: self.env.param_mode,
            unchecked: self.unchecked,
            parts: Some(Arc::new(parts)),
        }
    }
}

/// A 2-D grid for `n` workgroups so that no dimension exceeds `max_per_dim`. Kernels recover the
/// linear index as `wid.y * nwg.x + wid.x` and must bound-check it against `n`.
pub fn grid_2d(n: u64, max_per_dim: u32) -> Option<[u32; 3]> {
    let m = max_per_dim as u64;
    if n == 0 {
        return Some([0, 1, 1]);
    }
    if n <= m {
        return Some([n as u32, 1, 1]);
    }
    let y = n.div_ceil(m);
    if y > m {
        return None;
    }
    let x = n.div_ceil(y);
    Some([x as u32, y as u32, 1])
}

#[cfg(test)]
mod tests {
    use super::grid_2d;

    #[test]
    fn grids() {
        assert_eq!(grid_2d(10, 65535), Some([10, 1, 1]));
        let g = grid_2d(65536, 65535).unwrap();
        assert!(g[0] as u64 * g[1] as u64 >= 65536 && g[0] <= 65535);
        assert_eq!(grid_2d(65535u64 * 65535 + 1, 65535), None);
    }
}
