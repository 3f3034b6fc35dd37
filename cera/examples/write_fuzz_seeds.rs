//! Writes the fuzzing seed corpus: `cargo run -p cera --example write_fuzz_seeds -- fuzz/corpus`.

fn main() -> std::io::Result<()> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into()));
    std::fs::create_dir_all(dir.join("gguf"))?;
    std::fs::create_dir_all(dir.join("safetensors"))?;
    std::fs::write(dir.join("gguf/seed.gguf"), cera::fuzz_targets::seed_gguf())?;
    std::fs::write(dir.join("safetensors/seed.safetensors"), cera::fuzz_targets::seed_safetensors())?;
    println!("wrote seeds to {}", dir.display());
    Ok(())
}
