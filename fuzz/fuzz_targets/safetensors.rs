//! Fuzzes the safetensors header parser and tensor access.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    cera::fuzz_targets::safetensors(data);
});
