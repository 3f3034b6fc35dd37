//! Helpers for tests, here and in crates built on numr: tolerant comparison with the tolerances
//! defined in [`crate::dtype::rtol`], the shared test GPU ([`test_gpu`]), one test body on every
//! device ([`test_device!`](crate::test_device)), and (with the `testing` feature) naga
//! validation of WGSL and one GPU test body under every device profile
//! (`GpuProfile`, `numr::test_gpu_profiles!`).

use crate::dtype::{DType, rtol};

#[cfg(feature = "testing")]
mod profiles;
#[cfg(feature = "testing")]
pub use profiles::{GpuProfile, test_gpu_profile};

/// Compares `got` with the reference `want` at the tolerance of `dtype`: every element must satisfy
/// `|got - want| <= rtol(dtype) * max(|want|, rms(want))`. The RMS term keeps elements near zero
/// (after cancellation) from demanding more precision than the computation has. NaN never passes.
/// Returns a description of the worst element on failure.
pub fn check_close(got: &[f64], want: &[f64], dtype: DType) -> Result<(), String> {
    check_close_rtol(got, want, rtol(dtype))
}

/// [`check_close`] with an explicit relative tolerance.
pub fn check_close_rtol(got: &[f64], want: &[f64], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("length {} vs reference {}", got.len(), want.len()));
    }
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = tol * w.abs().max(rms);
        let err = (g - w).abs();
        if err.partial_cmp(&bound).is_none_or(|o| o.is_gt()) || g.is_nan() != w.is_nan() {
            let ratio = if bound > 0.0 { err / bound } else { f64::INFINITY };
            if worst.is_none_or(|(_, r)| ratio > r || ratio.is_nan()) {
                worst = Some((i, ratio));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, r)) => Err(format!("element {i}: got {} want {} (error {:.3}x the tolerance {tol})", got[i], want[i], r)),
    }
}

/// Parses and validates a WGSL kernel with naga (all capabilities numr may use), then writes
/// SPIR-V, which catches backend failures that validation alone misses.
#[cfg(feature = "testing")]
pub fn validate_wgsl(src: &str) -> Result<(), String> {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    let caps = Capabilities::IMMEDIATES
        | Capabilities::SHADER_FLOAT16
        | Capabilities::SHADER_FLOAT16_IN_FLOAT32
        | Capabilities::SUBGROUP
        | Capabilities::COOPERATIVE_MATRIX
        | Capabilities::SHADER_INT64
        | Capabilities::MEMORY_DECORATION_COHERENT;
    let info = Validator::new(ValidationFlags::all(), caps)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all())
        .validate(&module)
        .map_err(|e| e.emit_to_string(src))?;
    let opts = naga::back::spv::Options::default();
    std::panic::catch_unwind(|| naga::back::spv::write_vec(&module, &info, &opts, None))
        .map_err(|_| "naga's SPIR-V writer panicked".to_string())?
        .map_err(|e| format!("SPIR-V: {e}"))?;
    Ok(())
}

/// The environment variable that lets GPU tests skip when no adapter exists. CI never sets it.
pub const ALLOW_NO_GPU: &str = "NUMR_ALLOW_NO_GPU";

/// The environment variable that turns every skipped path into a failure: set it where the
/// adapter is expected to run everything (`scripts/h200.sh test` sets it on the H200), so a test
/// that silently stopped exercising a kernel fails instead of passing. CI (lavapipe) leaves it
/// unset: there the cooperative-matrix and `@coherent` paths cannot run and are skipped by name.
pub const REQUIRE_ALL_PATHS: &str = "NUMR_REQUIRE_ALL_PATHS";

/// Records that a test did not run `what` on `ctx`, and why (`no cooperative matrices`). It
/// prints `skipped: WHAT (WHY)` on standard error, so a test log names everything a run left
/// out, and panics when [`REQUIRE_ALL_PATHS`]`=1` is set, unless `ctx` was made without a
/// capability on purpose (a test profile with [`crate::GpuOptions::disable_subgroups`]: there
/// the subgroup and cooperative-matrix paths are left to the adapter's own profile, and the
/// line says `not under this profile`).
///
/// Every capability-dependent branch of a GPU test that leaves a path unexercised calls this;
/// the branch must still assert what it can (a typed refusal, the fallback's choice).
pub fn skip_path(ctx: &crate::GpuContext, what: &str, why: &str) {
    if ctx.options().disable_subgroups {
        eprintln!("not under this profile: {what} ({why}; subgroups disabled on purpose)");
        return;
    }
    if std::env::var(REQUIRE_ALL_PATHS).is_ok_and(|v| v == "1") {
        panic!("{what} was skipped ({why}), but {REQUIRE_ALL_PATHS}=1 requires every path to run on this adapter");
    }
    eprintln!("skipped: {what} ({why})");
}

/// A GPU context of the test's own (its own buffer pool, bind-group cache and counters), under
/// the same rule as [`test_gpu`] when no adapter exists. For tests that assert what a recording
/// creates ([`crate::GpuContext::bind_groups_created`], [`crate::GpuContext::pool_stats`]): on
/// the shared context, tests running beside them move those counters (a free buffer taken, the
/// bind-group cache cleared when full).
pub fn test_gpu_private() -> Option<crate::GpuContext> {
    test_gpu()?;
    Some(crate::GpuContext::new().unwrap_or_else(|e| panic!("a second context on the test adapter: {e}")))
}

/// The GPU for tests, shared by every test in the process. When no adapter is found the test
/// fails, unless `NUMR_ALLOW_NO_GPU=1` is set, in which case this returns `None` and the caller
/// skips.
pub fn test_gpu() -> Option<crate::GpuContext> {
    use std::sync::OnceLock;
    static CTX: OnceLock<Result<crate::GpuContext, String>> = OnceLock::new();
    match CTX.get_or_init(|| crate::GpuContext::new().map_err(|e| e.to_string())) {
        Ok(c) => Some(c.clone()),
        Err(e) => {
            if std::env::var(ALLOW_NO_GPU).is_ok_and(|v| v == "1") {
                eprintln!("skipping GPU test: {e} ({ALLOW_NO_GPU}=1)");
                None
            } else {
                panic!("no usable GPU adapter ({e}); GPU tests fail without one. Set {ALLOW_NO_GPU}=1 to skip them explicitly.");
            }
        }
    }
}

/// Runs one test body on every device: for each `name`, a function `fn name(dev: &Device)` in
/// scope becomes two tests, `name::cpu` (on [`Device::Cpu`](crate::Device::Cpu)) and `name::gpu`
/// (on the shared test GPU, [`test_gpu`]). The GPU test fails when no adapter exists, unless
/// [`ALLOW_NO_GPU`]`=1` is set, in which case it passes without running the body (as every GPU
/// test does). The idea of candle's `test_device!`.
///
/// The body must make its tensors on `dev` and assert against values that do not come from the
/// device under test (hand-computed values, a reference on plain slices): a body that compares
/// the device with itself tests nothing.
///
/// ```
/// use numr::{Device, Tensor};
///
/// fn add_rows(dev: &Device) {
///     let a = Tensor::from_slice(&[1f32, 2., 3., 4.], &[2, 2], dev).unwrap();
///     let b = Tensor::from_slice(&[10f32, 20.], &[2], dev).unwrap();
///     assert_eq!(a.add(&b).unwrap().to_vec::<f32>().unwrap(), vec![11., 22., 13., 24.]);
/// }
/// numr::test_device!(add_rows);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! test_device {
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn cpu() {
                    super::$name(&$crate::Device::Cpu);
                }

                #[test]
                fn gpu() {
                    if let Some(ctx) = $crate::testing::test_gpu() {
                        super::$name(&$crate::Device::Gpu(ctx));
                    }
                }
            }
        )+
    };
}
