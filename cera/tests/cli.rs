//! The `cera` binary end to end: inspect, tokenize, template, and a readable error.

use std::process::Command;

use cera::fetch::{ModelId, ensure_model};

fn cera(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cera")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn inspect_tokenize_template() {
    let path = ensure_model(ModelId::SmolLM2_135M).unwrap();
    let p = path.to_str().unwrap();
    let (ok, out, err) = cera(&["inspect", p]);
    assert!(ok, "{err}");
    for want in [
        "GGUF v3",
        "architecture:        llama",
        "block_count:         30",
        "pre-tokenizer `smollm`",
        "chat template:       present in file",
        "token_embd.weight",
        "Q8_0",
        "[576, 49152]",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let (ok, out, _) = cera(&["tokenize", p, "Hello world", "--ids-only"]);
    assert!(ok);
    assert_eq!(out.trim(), "19556 905");
    let (ok, out, _) = cera(&["tokenize", p, "<|im_start|>hi"]);
    assert!(ok);
    assert!(out.contains("2 tokens") && out.contains("\"<|im_start|>\""), "{out}");
    let (ok, out, _) = cera(&["template", p, "--system", "S", "--user", "U"]);
    assert!(ok);
    assert_eq!(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn bad_file_is_a_readable_error() {
    let bad = std::env::temp_dir().join(format!("cera-cli-bad-{}.gguf", std::process::id()));
    std::fs::write(&bad, b"GGUF\x09\x00\x00\x00").unwrap();
    let (ok, _, err) = cera(&["inspect", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.starts_with("error: unsupported GGUF version 9"), "{err}");
    let (ok, _, err) = cera(&["inspect", "/nonexistent/model"]);
    assert!(!ok && err.contains("no such file"), "{err}");
    let _ = std::fs::remove_file(&bad);
}
