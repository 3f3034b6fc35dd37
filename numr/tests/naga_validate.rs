//! Every WGSL variant numr generates parses, validates and compiles to SPIR-V with naga. No GPU.

use numr::gpu::KernelEnv;

#[test]
fn every_generated_kernel_validates() {
    let mut count = 0;
    for env in KernelEnv::all_for_validation() {
        for src in numr::kernels::all_sources(&env) {
            if let Err(e) = numr::testing::validate_wgsl(&src.wgsl) {
                panic!("{} ({env:?}) failed:\n{e}\n--- source ---\n{}", src.name, src.wgsl);
            }
            count += 1;
        }
    }
    assert!(count > 500, "only {count} variants");
}
