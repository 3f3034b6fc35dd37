//! `examples/custom_kernel.rs` (a hand-written kernel recorded ten times into one submit with a
//! per-step parameter) gives exactly the CPU's values: every intermediate is a small multiple of
//! a power of two, so f32 rounding cannot differ.

#[allow(dead_code)]
#[path = "../examples/custom_kernel.rs"]
mod example;

#[test]
fn the_custom_kernel_example_matches_the_cpu() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    let (got, want) = example::run(10_000, 10).unwrap();
    assert_eq!(got, want);
}
