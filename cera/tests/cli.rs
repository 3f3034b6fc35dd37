//! The `cera` binary end to end: run, chat, inspect, tokenize, template, and readable errors.
//!
//! `inspect_tokenize_template` and the generation tests (`run_*`, `chat_*`: SmolLM2 on the CPU
//! path, greedy) use the real test model; everything else runs offline, on small synthetic GGUF
//! files written with `cera::gguf::GgufBuilder` into a temporary folder.
//!
//! The binary is the `cli` feature's: without it this file is empty.

#![cfg(feature = "cli")]

mod cli_support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use cera::fetch::{ModelId, ensure_model};
use cera::gguf::{GgufBuilder, MetadataValue};
use cli_support::*;

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
fn synthetic_model_works() {
    let dir = TempDir::new("tiny");
    let model = dir.path("tiny.gguf");
    tiny_model(&model, 3);
    let m = model.to_str().unwrap();
    let (ok, out, err) = cera(&["inspect", m]);
    assert!(ok, "{err}");
    assert!(
        out.contains("name:                tiny") && out.contains("blk.2.attn_norm.weight") && out.contains("chat template:       present in file"),
        "{out}"
    );
    let (ok, out, err) = cera(&["tokenize", m, "a a", "--ids-only", "--no-special"]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "5 5");
}

#[test]
fn closed_stdout_ends_quietly() {
    let dir = TempDir::new("pipe");
    // Every command writes far more than a pipe holds (64 KiB), so the write after the pipe is
    // closed fails with EPIPE.
    let model = dir.path("many-tensors.gguf");
    tiny_model(&model, 20_000);
    let m = model.to_str().unwrap();
    let text = dir.path("text.txt");
    std::fs::write(&text, "a ".repeat(200_000)).unwrap();
    let long = "x".repeat(100_000);
    let cases: [&[&str]; 4] =
        [&["inspect", m], &["inspect", m, "--metadata"], &["tokenize", m, "--file", text.to_str().unwrap()], &["template", m, "--user", &long]];
    for args in cases {
        let (code, err) = cera_closing_stdout(args, 16);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    let (code, err) = cera_closing_stdout(&["tokenize", m, "--file", text.to_str().unwrap(), "--ids-only"], 0);
    assert!(!err.contains("panicked") && code == Some(0), "{err}");
    // `fetch` prints one line: close the pipe before it writes. The cache holds the real file
    // (linked, or copied where a link cannot be made), which passes the SHA-256 check, so nothing
    // is downloaded: a placeholder would fail the check and send `fetch` to the network.
    let cache = TempDir::new("pipe-cache");
    let real = smollm2();
    let cached = cache.path(ModelId::SmolLM2_135M.file_name());
    if std::fs::hard_link(&real, &cached).is_err() {
        std::fs::copy(&real, &cached).unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_cera"))
        .args(["fetch", "smollm2-135m"])
        .env("CERA_MODEL_CACHE", &cache.0)
        // A download attempt fails here instead of reaching the network.
        .env("CERA_PYTHON", "/nonexistent/python3")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && out.status.success(), "{err}");
}

#[test]
fn template_keeps_command_line_order() {
    let dir = TempDir::new("template");
    let model = dir.path("tiny.gguf");
    tiny_model(&model, 1);
    let m = model.to_str().unwrap();
    let turn = |role: &str, text: &str| format!("<|im_start|>{role}\n{text}<|im_end|>\n");
    let (ok, out, err) = cera(&["template", m, "--user", "a", "--assistant", "b", "--user", "c", "--assistant", "d", "--no-generation-prompt"]);
    assert!(ok, "{err}");
    assert_eq!(out, [turn("user", "a"), turn("assistant", "b"), turn("user", "c"), turn("assistant", "d")].concat());
    // Any order, any number of each role, `--system` included; the generation prompt follows.
    let (ok, out, err) = cera(&["template", m, "--system", "s1", "--assistant", "x", "--assistant", "y", "--user", "u", "--system", "s2"]);
    assert!(ok, "{err}");
    let want =
        [turn("system", "s1"), turn("assistant", "x"), turn("assistant", "y"), turn("user", "u"), turn("system", "s2"), "<|im_start|>assistant\n".into()];
    assert_eq!(out, want.concat());
    // At least one message.
    let (ok, _, err) = cera(&["template", m]);
    assert!(!ok && !err.contains("panicked"), "{err}");
}

#[test]
fn bad_file_is_a_readable_error() {
    let dir = TempDir::new("bad");
    let bad = dir.path("bad.gguf");
    std::fs::write(&bad, b"GGUF\x09\x00\x00\x00").unwrap();
    let b = bad.to_str().unwrap();
    for cmd in ["inspect", "tokenize", "template"] {
        let mut args = vec![cmd, b];
        args.extend(match cmd {
            "tokenize" => &["hi"][..],
            "template" => &["--user", "hi"][..],
            _ => &[][..],
        });
        let (ok, _, err) = cera(&args);
        assert!(!ok && !err.contains("panicked"), "{cmd}: {err}");
        assert!(err.starts_with(&format!("error: {b}: unsupported GGUF version 9")), "{cmd}: {err}");
    }
    // A truncated header, and a file that is GGUF only by its name.
    let truncated = dir.path("truncated.gguf");
    std::fs::write(&truncated, b"GGUF\x03\x00\x00\x00\x01").unwrap();
    let named = dir.path("named.gguf");
    std::fs::write(&named, b"not gguf at all").unwrap();
    for p in [&truncated, &named] {
        let p = p.to_str().unwrap();
        let (ok, _, err) = cera(&["inspect", p]);
        assert!(!ok && !err.contains("panicked") && err.starts_with(&format!("error: {p}: ")), "{err}");
    }
    // Safetensors: a header length past the end of the file.
    let st = dir.path("bad.safetensors");
    std::fs::write(&st, 1000u64.to_le_bytes()).unwrap();
    let s = st.to_str().unwrap();
    let (ok, _, err) = cera(&["inspect", s]);
    assert!(!ok && !err.contains("panicked") && err.starts_with(&format!("error: {s}: ")), "{err}");
    // A GGUF file without a tokenizer: `tokenize` names the file too.
    let no_tok = dir.path("no-tokenizer.gguf");
    let mut g = GgufBuilder::new(3);
    g.kv("general.architecture", MetadataValue::String("llama".into()));
    std::fs::write(&no_tok, g.build()).unwrap();
    let n = no_tok.to_str().unwrap();
    let (ok, _, err) = cera(&["tokenize", n, "hi"]);
    assert!(!ok && err.starts_with(&format!("error: {n}: ")) && err.contains("tokenizer.ggml.model"), "{err}");
    let (ok, _, err) = cera(&["inspect", "/nonexistent/model"]);
    assert!(!ok && err.contains("no such file"), "{err}");
}

#[test]
fn fetch_without_python_is_a_clear_error() {
    let empty_path = TempDir::new("no-python-path");
    let cache = TempDir::new("no-python-cache");
    for args in [&["fetch", "smollm2-135m"][..], &["inspect", "smollm2-135m"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_cera"))
            .args(args)
            .env("PATH", &empty_path.0)
            .env("CERA_MODEL_CACHE", &cache.0)
            .env_remove("CERA_PYTHON")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.trim_end(), "error: python3 was not found: install Python 3 with pip to fetch models, or pass a model path", "{args:?}");
    }
}

#[test]
fn fetch_runs_the_python_of_cera_python() {
    let cache = TempDir::new("cera-python-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_cera"))
        .args(["fetch", "smollm2-135m"])
        .env("CERA_MODEL_CACHE", &cache.0)
        .env("CERA_PYTHON", "/nonexistent/python3.99")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim_end(), "error: /nonexistent/python3.99 was not found: install Python 3 with pip to fetch models, or pass a model path");
}

#[test]
fn run_text_and_json() {
    let m = smollm2();
    let q = "Why is the sky blue?";
    let mut args = vec!["run", "-m", &m];
    args.extend(GREEDY_CPU);
    args.push(q);
    let (ok, text, err) = cera(&args);
    assert!(ok, "{err}");
    for want in ["load ", "prompt 36 tokens", "generated 8 tokens", "max_tokens", "tok/s"] {
        assert!(err.contains(want), "stats line without {want:?}: {err}");
    }
    assert!(text.ends_with('\n') && text.starts_with("The "), "{text:?}");
    args.pop();
    args.extend(["--json", "--top-logprobs", "3", "-p", q]);
    let (ok, out, err) = cera(&args);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let golden = golden_chat_single();
    // The chat template applied to the prompt as one user turn, as llama.cpp's golden.
    assert_eq!(v["prompt_ids"], golden["prompt_ids"]);
    let ids: Vec<u64> = v["generated_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 8);
    assert_eq!(ids[0], golden["generated_ids"][0].as_u64().unwrap(), "llama.cpp's first token (margin 4.1)");
    assert_eq!(v["finish_reason"], "max_tokens");
    assert_eq!(format!("{}\n", v["text"].as_str().unwrap()), text, "the same greedy run, as text and as JSON");
    for key in ["load_ms", "prompt_tokens", "prefill_ms", "prefill_tok_s", "generated_tokens", "decode_ms", "decode_tok_s"] {
        assert!(v["timings"][key].is_number(), "timings.{key}: {v}");
    }
    assert_eq!(v["timings"]["prompt_tokens"], 36);
    let tops = v["top_logprobs"].as_array().unwrap();
    assert_eq!(tops.len(), 8);
    for (i, step) in tops.iter().enumerate() {
        let step = step.as_array().unwrap();
        assert_eq!(step.len(), 3);
        assert_eq!(step[0]["id"].as_u64(), Some(ids[i]), "greedy takes the most likely");
        let lps: Vec<f64> = step.iter().map(|e| e["logprob"].as_f64().unwrap()).collect();
        assert!(lps.iter().all(|&l| l <= 0.0) && lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
    }
    // --raw: the prompt as it is (SmolLM2 adds no BOS); a stop string ends it, unprinted.
    let (ok, out, err) = cera(&["run", "-m", &m, "--device", "cpu", "-n", "40", "--temp", "0", "--raw", "--stop", "\n", "The capital of France is"]);
    assert!(ok, "{err}");
    assert_eq!(out, " Paris.\n");
    assert!(err.contains("prompt 5 tokens") && err.contains("| stop"), "{err}");
}

#[test]
fn chat_through_stdin() {
    let m = smollm2();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cera"))
        .args(["chat", "-m", &m, "--device", "cpu", "-n", "16", "--temp", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"What is the capital of France?\n/nonsense\nAnd of Italy?\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.lines().filter(|l| !l.trim().is_empty()).count(), 2, "two replies: {stdout:?}");
    assert!(!stdout.contains("> "), "no prompt marker when standard input is not a terminal");
    assert!(stderr.contains("unknown command /nonsense"), "{stderr}");
    let stats: Vec<&str> = stderr.lines().filter(|l| l.contains("tok/s")).collect();
    assert_eq!(stats.len(), 2, "{stderr}");
    assert!(stats[0].starts_with("load ") && !stats[1].starts_with("load "), "{stderr}");
    // The second turn reuses the first turn's cache: the whole first prompt at least (37 tokens).
    let reused: usize = stats[1].split(" reused)").next().and_then(|s| s.rsplit('(').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(reused >= 37, "{}", stats[1]);
}

#[test]
fn generation_ends_quietly_when_stdout_closes() {
    let m = smollm2();
    for cmd in ["run", "chat"] {
        let mut args = vec![cmd, "-m", &m, "--device", "cpu", "-n", "64", "--temp", "0"];
        if cmd == "run" {
            args.push("Why is the sky blue?");
        }
        let mut child =
            Command::new(env!("CARGO_BIN_EXE_cera")).args(&args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"Why is the sky blue?\n").unwrap();
        drop(stdin);
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 1];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked") && !err.contains("error"), "{cmd}: {err}");
        assert_eq!(out.status.code(), Some(0), "{cmd}: {err}");
    }
}

#[test]
fn run_prompt_over_the_context_is_a_clear_error() {
    let m = smollm2();
    let (ok, out, err) = cera(&["run", "-m", &m, "--device", "cpu", "-c", "16", "Why is the sky blue?"]);
    assert!(!ok && out.is_empty() && !err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end(), "error: 36 tokens do not fit the context of 16 positions (a longer context: -c/--ctx-size)");
}

#[test]
fn run_bad_flags_and_files_are_clear_errors() {
    let dir = TempDir::new("run-bad");
    for (args, want) in [
        (&["run", "--device", "tpu", "hi"][..], "unknown device `tpu` (auto, gpu, cpu)"),
        (&["run", "--kv-type", "q4", "hi"][..], "unknown KV cache type `q4` (f16, q8_0, f32 on the CPU)"),
        (&["run", "-n", "many", "hi"][..], "invalid value 'many'"),
        (&["run", "-p", "a", "b"][..], "cannot be used with"),
        (&["run"][..], "error: no prompt: "),
        (&["run", "--raw", "--system", "s", "hi"][..], "cannot be used with"),
    ] {
        let (ok, _, err) = cera(args);
        assert!(!ok && !err.contains("panicked") && err.contains(want), "{args:?}: {err}");
    }
    let (ok, _, err) = cera(&["run", "-m", "/nonexistent/model.gguf", "hi"]);
    assert!(!ok && err.contains("/nonexistent/model.gguf") && err.contains("no such file"), "{err}");
    // A GGUF file that is no model: the error names the file and what is missing.
    let model = dir.path("tiny.gguf");
    tiny_model(&model, 1);
    let m = model.to_str().unwrap();
    for cmd in ["run", "chat"] {
        let mut args = vec![cmd, "-m", m, "--device", "cpu"];
        if cmd == "run" {
            args.push("hi");
        }
        let (ok, _, err) = cera(&args);
        assert!(!ok && !err.contains("panicked") && err.starts_with(&format!("error: {m}: ")), "{cmd}: {err}");
    }
}

/// `cera inspect` and `cera run` take a Hugging Face folder as `-m`: the tiny llama checkpoint
/// of `tests/golden/hf/` gives transformers' greedy ids for its first golden prompt.
#[test]
fn hf_folder_as_model() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/hf/llama-tiny");
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(format!("{dir}/golden.json")).unwrap()).unwrap();
    let case = &g["cases"][0];
    let (ok, out, err) = cera(&["inspect", dir]);
    assert!(ok, "{err}");
    assert!(out.contains("safetensors") && out.contains("blk.0.attn_q.weight"), "{out}");
    let n = case["generated"].as_array().unwrap().len().to_string();
    let text = case["text"].as_str().unwrap();
    let (ok, out, err) = cera(&["run", "-m", dir, "--device", "cpu", "-n", &n, "--temp", "0", "--raw", "--json", "-p", text]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["prompt_ids"], case["ids"]);
    assert_eq!(v["generated_ids"], case["generated"], "transformers' greedy continuation");
    // `cera bench` reads the folder's graph and formats too (here an AWQ checkpoint).
    let awq = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/hf/llama-tiny-awq");
    let (ok, out, err) = cera(&["bench", "-m", awq, "-p", "8", "-n", "4", "-r", "1", "--device", "cpu"]);
    assert!(ok, "{err}");
    assert!(out.contains("| llama-tiny-awq | AWQ |") && out.contains("tg4"), "{out}");
}

#[test]
fn tune_and_diag_settings_are_checked_and_applied() {
    let awq = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/hf/llama-tiny-awq");
    // Bad settings are clap errors naming the key and what it takes, before anything loads.
    let (ok, _, err) = cera(&["bench", "-m", awq, "--tune", "q8_rowz=4"]);
    assert!(!ok && err.contains("--tune") && err.contains("unknown key `q8_rowz` (known: decode_fusion,"), "{err}");
    let (ok, _, err) = cera(&["run", "-m", awq, "-p", "a", "--tune", "prefill_split_k=3"]);
    assert!(!ok && err.contains("`prefill_split_k=3`: expected 1 (off) or 2 (on)") && !err.contains("panicked"), "{err}");
    let (ok, _, err) = cera(&["bench", "-m", awq, "--diag", "q8_rows=4"]);
    assert!(!ok && err.contains("unknown key `q8_rows` (known: ablate, step_trace, chain_verbose)"), "{err}");
    let (ok, _, err) = cera(&["bench", "-m", awq, "--tune", "help"]);
    assert!(!ok && err.contains("prefill_lead: dispatches"), "{err}");
    // Good ones load (on the GPU where there is one: the ablation then reports what it dropped).
    let Some(_) = numr::testing::test_gpu() else { return };
    let (ok, out, err) = cera(&[
        "bench",
        "-m",
        awq,
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--device",
        "gpu",
        "--tune",
        "q8_rows=4",
        "--tune",
        "prefill_lead=0",
        "--diag",
        "ablate=+quant_gemv",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("tg4") && err.contains("ablate=+quant_gemv: 0 decode dispatches dropped,") && !err.contains(" 0 doubled"), "{out}\n{err}");
}
