//! Fuzzes the GGUF reader, and the tokenizer and chat template built from what it reads.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    cera::fuzz_targets::gguf(data);
});
