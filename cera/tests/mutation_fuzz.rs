//! Deterministic mutation fuzzing on stable Rust: valid seed files are mutated with a seeded
//! PRNG tens of thousands of times and fed to the readers, which must never panic. The same
//! entry points back the cargo-fuzz targets in `fuzz/`. `CERA_FUZZ_ITERS` raises the count.

mod rng_support;

use cera::fuzz_targets;
use rng_support::Rng;

const INTERESTING: [u64; 10] = [0, 1, 2, 7, 0xff, 0xffff, 0xffff_ffff, 1 << 60, i64::MAX as u64, u64::MAX];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if d.is_empty() {
            d.push(0);
        }
        match rng.below(7) {
            0 => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(d.len());
                d[i] = rng.next() as u8;
            }
            2 => {
                // An interesting little-endian u32 or u64 over a length/count/offset field.
                let v = INTERESTING[rng.below(INTERESTING.len())];
                let w = if rng.below(2) == 0 { 4 } else { 8 };
                let i = rng.below(d.len());
                for (k, b) in v.to_le_bytes().iter().take(w).enumerate() {
                    if let Some(x) = d.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            3 => d.truncate(rng.below(d.len())),
            4 => {
                let i = rng.below(d.len());
                let n = 1 + rng.below(16);
                d.splice(i..i, std::iter::repeat_n(rng.next() as u8, n));
            }
            5 => {
                let i = rng.below(d.len());
                let n = rng.below(d.len() - i).min(64);
                d.drain(i..i + n);
            }
            _ => {
                let a = rng.below(d.len());
                let n = rng.below(d.len() - a).min(64);
                let chunk: Vec<u8> = d[a..a + n].to_vec();
                let at = rng.below(d.len());
                d.splice(at..at, chunk);
            }
        }
    }
    d
}

fn iterations() -> usize {
    std::env::var("CERA_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

#[test]
fn gguf_survives_mutations() {
    let seed = fuzz_targets::seed_gguf();
    // The seed reaches every stage: header, tensors, tokenizer, template.
    let file = cera::gguf::GgufFile::from_bytes(seed.clone()).unwrap();
    let tok = cera::tokenizer::Tokenizer::from_gguf(&file).unwrap();
    assert!(!tok.encode("Hello", Default::default()).unwrap().is_empty());
    assert!(cera::chat_template::ChatTemplate::from_gguf(&file, &tok).is_ok());
    fuzz_targets::gguf(&seed);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..iterations() {
        let input = mutate(&mut rng, &seed);
        fuzz_targets::gguf(&input);
    }
}

#[test]
fn safetensors_survives_mutations() {
    let seed = fuzz_targets::seed_safetensors();
    assert!(cera::safetensors::SafetensorsModel::from_bytes(seed.clone(), None).is_ok());
    fuzz_targets::safetensors(&seed);
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for _ in 0..iterations() {
        let input = mutate(&mut rng, &seed);
        fuzz_targets::safetensors(&input);
    }
}

/// Inputs that once crashed a fuzz target (`cera/tests/fuzz_regressions/<target>/`).
#[test]
fn fuzz_regressions() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    type Target = fn(&[u8]);
    let targets: [(&str, Target); 2] = [("gguf", fuzz_targets::gguf), ("safetensors", fuzz_targets::safetensors)];
    for (name, run) in targets {
        for entry in std::fs::read_dir(dir.join(name)).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("crash-")) {
                run(&std::fs::read(&path).unwrap());
            }
        }
    }
}
