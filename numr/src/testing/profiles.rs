//! Device profiles for GPU tests: the one test adapter seen as several devices, one for each
//! configuration the kernels choose between ([`GpuProfile`]), and
//! `numr::test_gpu_profiles!`, which runs one test body on each.

use std::sync::OnceLock;

use crate::gpu::ParamMode;
use crate::{GpuContext, GpuOptions};

/// A configuration of the test adapter. Each profile other than [`GpuProfile::Default`] takes
/// something away from the adapter (never adds), so that the kernel choices made from
/// [`crate::gpu::Capabilities`] take their fallback paths. Where the adapter lacks the thing taken
/// away anyway (no subgroups, no immediates), the profile is the same device as `Default` and its
/// tests still run: a profile is never skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuProfile {
    /// The adapter as it is ([`super::test_gpu`], the shared test context).
    Default,
    /// Kernel parameters through the uniform arena ([`ParamMode::UniformArena`]) instead of
    /// immediates.
    UniformParams,
    /// The SUBGROUP feature not requested ([`GpuOptions::disable_subgroups`]), so
    /// `Capabilities::subgroups` is false and kernels take their subgroup-free variants.
    NoSubgroups,
}

impl GpuProfile {
    /// Every profile, in the order `numr::test_gpu_profiles!` names its tests.
    pub const ALL: [GpuProfile; 3] = [GpuProfile::Default, GpuProfile::UniformParams, GpuProfile::NoSubgroups];

    /// The options of this profile, on top of [`GpuOptions::from_env`].
    pub fn options(self) -> GpuOptions {
        let base = GpuOptions::from_env();
        match self {
            GpuProfile::Default => base,
            GpuProfile::UniformParams => GpuOptions { param_mode: Some(ParamMode::UniformArena), ..base },
            GpuProfile::NoSubgroups => GpuOptions { disable_subgroups: true, ..base },
        }
    }
}

/// The test context of `profile`, shared by every test of that profile in the process
/// ([`GpuProfile::Default`] is [`super::test_gpu`]'s context). Under the same rule as
/// [`super::test_gpu`] when no adapter exists: the test fails, unless
/// [`ALLOW_NO_GPU`](super::ALLOW_NO_GPU)`=1` is set, in which case this returns `None`.
/// A context the adapter has but this profile's options cannot make fails the test.
pub fn test_gpu_profile(profile: GpuProfile) -> Option<GpuContext> {
    let default = super::test_gpu()?;
    static CTX: [OnceLock<Result<GpuContext, String>>; 3] = [const { OnceLock::new() }; 3];
    let slot = match profile {
        GpuProfile::Default => return Some(default),
        GpuProfile::UniformParams => &CTX[1],
        GpuProfile::NoSubgroups => &CTX[2],
    };
    match slot.get_or_init(|| GpuContext::with_options(profile.options()).map_err(|e| e.to_string())) {
        Ok(c) => Some(c.clone()),
        Err(e) => panic!("the test adapter under profile {profile:?}: {e}"),
    }
}

/// Runs one GPU test body under every [`GpuProfile`]: for each `name`, a function
/// `fn name(ctx: &GpuContext)` in scope becomes the tests `name::default`,
/// `name::uniform_params` and `name::no_subgroups`, each on that profile's shared context
/// ([`test_gpu_profile`]). Like every GPU test, each fails when no adapter exists unless
/// [`ALLOW_NO_GPU`](super::ALLOW_NO_GPU)`=1` is set (then it passes without running the body).
///
/// For parity tests of GPU ops against a CPU reference on plain slices: the body must compare
/// with values that do not come from the GPU. Needs numr's `testing` feature.
///
/// ```
/// use numr::{Device, GpuContext, Tensor};
///
/// fn add_rows(ctx: &GpuContext) {
///     let dev = Device::Gpu(ctx.clone());
///     let a = Tensor::from_slice(&[1f32, 2., 3., 4.], &[2, 2], &dev).unwrap();
///     let b = Tensor::from_slice(&[10f32, 20.], &[2], &dev).unwrap();
///     assert_eq!(a.add(&b).unwrap().to_vec::<f32>().unwrap(), vec![11., 22., 13., 24.]);
/// }
/// numr::test_gpu_profiles!(add_rows);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! test_gpu_profiles {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                fn run(profile: $crate::testing::GpuProfile) {
                    if let Some(ctx) = $crate::testing::test_gpu_profile(profile) {
                        super::$name(&ctx);
                    }
                }

                #[test]
                fn default() {
                    run($crate::testing::GpuProfile::Default);
                }

                #[test]
                fn uniform_params() {
                    run($crate::testing::GpuProfile::UniformParams);
                }

                #[test]
                fn no_subgroups() {
                    run($crate::testing::GpuProfile::NoSubgroups);
                }
            }
        )+
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Tensor};

    #[test]
    fn profiles_take_away_what_they_name() {
        for p in GpuProfile::ALL {
            let Some(ctx) = test_gpu_profile(p) else { return };
            let caps = ctx.capabilities();
            match p {
                GpuProfile::Default => {}
                GpuProfile::UniformParams => assert_eq!(caps.param_mode, ParamMode::UniformArena),
                GpuProfile::NoSubgroups => assert!(!caps.subgroups),
            }
        }
    }

    /// A sum long enough for the reduction's cross-workgroup path, with and without subgroups.
    fn sum_rows(ctx: &GpuContext) {
        let n = 5000usize;
        let v: Vec<f32> = (0..2 * n).map(|i| (i % 7) as f32 - 3.0).collect();
        let want: Vec<f32> = v.chunks(n).map(|r| r.iter().sum()).collect();
        let t = Tensor::from_slice(&v, &[2, n], &Device::Gpu(ctx.clone())).unwrap();
        assert_eq!(t.sum_last().unwrap().to_vec::<f32>().unwrap(), want);
    }
    crate::test_gpu_profiles!(sum_rows);
}
