//! The `cera` command as llama.cpp and Ollama users expect it: flag values checked with a clear
//! message, llama.cpp's multi-letter flags, `-m` for every subcommand that takes a model,
//! `--top-logprobs` in text mode and with token texts in JSON, bench's labels and its CPU table,
//! how a model is found (a folder, an unknown name, a truncated file, the adapter, the context),
//! and the warning for a model without a chat template.
//!
//! The generation tests run the real test models on the CPU path, greedy; the rest runs on small
//! synthetic GGUF files, or on the real ones with changed metadata (`rewrite_gguf`).

#![cfg(feature = "cli")]

mod cli_support;

use std::process::Command;

use cera::gguf::MetadataValue;
use cli_support::*;

/// Runs `cera ARGS`, expecting a failure with a message (no panic, no clap suggestion).
fn refused(args: &[&str]) -> String {
    let (ok, out, err) = cera(args);
    assert!(!ok && out.is_empty() && !err.contains("panicked"), "{args:?}: {err}");
    assert!(!err.contains("-- -") && !err.contains("tip:"), "{args:?}: clap's suggestion instead of the reason: {err}");
    err
}

#[test]
fn out_of_range_values_say_what_the_flag_takes() {
    let max = 4 * std::thread::available_parallelism().unwrap().get();
    let too_many = (max + 1).to_string();
    let threads = format!("-t takes 1 to {max} threads");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", "--temp", "-1", "hi"], "the temperature takes a finite number of at least 0 (0: greedy)"),
        (vec!["run", "--temp", "nan", "hi"], "the temperature takes a finite number"),
        (vec!["run", "--temp", "inf", "hi"], "the temperature takes a finite number"),
        (vec!["run", "--top-p", "0", "hi"], "top-p takes a number above 0 and at most 1"),
        (vec!["run", "--top-p", "1.5", "hi"], "top-p takes a number above 0 and at most 1"),
        (vec!["run", "--min-p", "-0.1", "hi"], "min-p takes a number from 0 to 1"),
        (vec!["run", "--min-p", "2", "hi"], "min-p takes a number from 0 to 1"),
        (vec!["run", "--repeat-penalty", "0", "hi"], "the repeat penalty takes a finite number above 0"),
        (vec!["run", "--presence-penalty", "-inf", "hi"], "the penalty takes a finite number"),
        (vec!["run", "-t", "0", "hi"], &threads),
        (vec!["run", "-t", "-2", "hi"], &threads),
        (vec!["run", "-t", &too_many, "hi"], &threads),
        (vec!["run", "-n", "-2", "hi"], "-n takes a number of tokens of at least 0, or -1"),
        (vec!["run", "-s", "-2", "hi"], "the seed takes a number from 0 to 9223372036854775807, or -1"),
        (vec!["run", "--top-logprobs", "101", "hi"], "--top-logprobs takes a number from 0 to 100"),
        (vec!["run", "-b", "0", "hi"], "the batch size takes a number of tokens of at least 1"),
        (vec!["run", "--temp", "warm", "hi"], "`warm` is not a number"),
        (vec!["run", "--draft-p-min", "1.5", "hi"], "draft-p-min takes a probability from 0 to 1"),
        (vec!["chat", "--temp", "-0.5"], "the temperature takes a finite number"),
        (vec!["chat", "--top-p", "-1"], "top-p takes a number above 0"),
        (vec!["bench", "-t", "0"], &threads),
    ];
    for (args, want) in cases {
        let err = refused(&args);
        // clap names the flag and the value; the parser says what is wrong with it.
        assert!(err.contains(want) && err.contains(&format!("'{}'", args[2])), "{args:?}: {err}");
    }
}

#[test]
fn edge_values_are_accepted() {
    let m = smollm2();
    let max = (4 * std::thread::available_parallelism().unwrap().get()).to_string();
    let args = ["run", "-m", &m, "--device", "cpu", "-n", "2", "--temp", "0", "--top-p", "1", "--min-p", "0", "-s", "-1", "-t", &max, "--raw", "Hello"];
    let (ok, out, err) = cera(&args);
    assert!(ok && !out.is_empty(), "{err}");
}

#[test]
fn llama_cpp_flags_are_rewritten_or_refused() {
    let m = smollm2();
    let dir = TempDir::new("llama-flags");
    let prompt = dir.path("prompt.txt");
    std::fs::write(&prompt, "Why is the sky blue?").unwrap();
    let p = prompt.to_str().unwrap();
    let json = |extra: &[&str]| {
        let mut args = vec!["run", "-m", &m, "--json"];
        args.extend(GREEDY_CPU);
        args.extend(extra);
        let (ok, out, err) = cera(&args);
        assert!(ok, "{extra:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        (v["prompt_ids"].clone(), v["generated_ids"].clone(), err)
    };
    // -sys is --system; -ngl and -fa are accepted and change nothing; -f FILE is still the prompt.
    let (want_prompt, want_ids, _) = json(&["--system", "Be brief.", "-f", p]);
    let (prompt_ids, ids, err) = json(&["-ngl", "99", "-fa", "on", "-sys", "Be brief.", "-f", p]);
    assert_eq!((prompt_ids, ids), (want_prompt.clone(), want_ids.clone()));
    assert!(err.contains("note: -ngl 99 is llama.cpp's and does nothing here: cera runs every layer on the GPU (--device cpu"), "{err}");
    assert!(err.contains("note: -fa on is llama.cpp's and does nothing here: cera's attention is always one fused kernel"), "{err}");
    // Long forms, `=` values and a bare -fa (no value) before -f.
    let (prompt_ids, ids, err) = json(&["--n-gpu-layers=20", "--system-prompt", "Be brief.", "-fa", "-f", p, "--flash-attn", "auto"]);
    assert_eq!((prompt_ids, ids), (want_prompt, want_ids));
    assert!(err.contains("note: --n-gpu-layers 20 ") && err.contains("note: -fa is") && err.contains("note: --flash-attn auto "), "{err}");
    // What cera does not do: an error that says what to do instead.
    for (args, want) in [
        (&["run", "-cnv", "hi"][..], "-cnv: cera runs a conversation with `cera chat`"),
        (&["run", "--conversation", "hi"][..], "--conversation: cera runs a conversation with `cera chat`"),
        (
            &["run", "-hf", "org/model-GGUF", "hi"][..],
            "-hf: cera does not download from the Hugging Face hub: download the GGUF file and pass -m FILE (or `cera fetch NAME`",
        ),
        (&["run", "--hf-repo=org/model-GGUF", "hi"][..], "--hf-repo: cera does not download from the Hugging Face hub"),
        (&["chat", "-ngl"][..], "-ngl takes a value"),
    ] {
        let err = refused(args);
        assert!(err.starts_with(&format!("error: {want}")), "{args:?}: {err}");
    }
    // A prompt that is the text "-fa" is left alone.
    let (ok, _, err) = cera(&["run", "-m", &m, "--device", "cpu", "-n", "1", "--temp", "0", "-p", "-fa"]);
    assert!(ok && !err.contains("note: -fa"), "{err}");
}

#[test]
fn every_model_subcommand_takes_dash_m() {
    let dir = TempDir::new("dash-m");
    let model = dir.path("tiny.gguf");
    tiny_model(&model, 2);
    let m = model.to_str().unwrap();
    for (flag, positional) in [
        (vec!["inspect", "-m", m], vec!["inspect", m]),
        (vec!["tokenize", "-m", m, "a a", "--ids-only", "--no-special"], vec!["tokenize", m, "a a", "--ids-only", "--no-special"]),
        (vec!["template", "--model", m, "--user", "U"], vec!["template", m, "--user", "U"]),
    ] {
        let (ok, out, err) = cera(&flag);
        assert!(ok && !out.is_empty(), "{flag:?}: {err}");
        assert_eq!(cera(&positional).1, out, "{flag:?}");
    }
    assert_eq!(cera(&["tokenize", "-m", m, "a a", "--ids-only", "--no-special"]).1.trim(), "5 5");
    let text = dir.path("text.txt");
    std::fs::write(&text, "a a").unwrap();
    let (ok, out, err) = cera(&["tokenize", "-m", m, "-f", text.to_str().unwrap(), "--ids-only", "--no-special"]);
    assert!(ok && out.trim() == "5 5", "{err}");
    // Both, or neither: an error.
    for args in [&["inspect", "-m", m, m][..], &["template", "-m", m, m, "--user", "U"][..], &["tokenize", "-m", m, m, "a"][..], &["inspect"][..]] {
        refused(args);
    }
    assert!(refused(&["tokenize", "-m", m, "a", "-f", text.to_str().unwrap()]).contains("not both"));
}

/// `--top-logprobs` without `--json`: one line per token on standard error; with `--json`, the
/// chosen token and each top entry carry the token's text.
#[test]
fn top_logprobs_in_text_and_json() {
    let m = smollm2();
    let mut args = vec!["run", "-m", &m];
    args.extend(GREEDY_CPU);
    args.extend(["--top-logprobs", "3", "Why is the sky blue?"]);
    let (ok, text, err) = cera(&args);
    assert!(ok, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("logprob ")).collect();
    assert_eq!(lines.len(), 8, "{err}");
    for l in &lines {
        let top = l.split(" | top: ").nth(1).unwrap_or_else(|| panic!("{l}"));
        assert_eq!(top.matches(", ").count() + 1, 3, "{l}");
        // Greedy: the chosen token is the most likely one.
        assert!(top.starts_with(l["logprob ".len()..].split(" | ").next().unwrap()), "{l}");
    }
    args.retain(|a| *a != "--top-logprobs" && *a != "3");
    assert_eq!(cera(&args).1, text, "the same text without --top-logprobs");
    args.pop();
    args.extend(["--top-logprobs", "3", "--json", "Why is the sky blue?"]);
    let (ok, out, err) = cera(&args);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let chosen = v["logprobs"].as_array().unwrap();
    let tops = v["top_logprobs"].as_array().unwrap();
    assert_eq!((chosen.len(), tops.len()), (8, 8));
    let mut joined = String::new();
    for (i, c) in chosen.iter().enumerate() {
        assert_eq!(c["id"], v["generated_ids"][i]);
        assert_eq!(c["id"], tops[i][0]["id"], "greedy takes the most likely");
        assert_eq!(c["logprob"], tops[i][0]["logprob"]);
        assert_eq!(c["token"], tops[i][0]["token"]);
        assert!(tops[i].as_array().unwrap().iter().all(|e| e["token"].is_string() && e["logprob"].as_f64().unwrap() <= 0.0));
        joined.push_str(c["token"].as_str().unwrap());
    }
    assert_eq!(joined, v["text"].as_str().unwrap(), "the tokens' texts make the text");
}

#[test]
fn bench_labels_by_file_type_and_hides_gpu_columns_on_the_cpu() {
    let dir = TempDir::new("bench-label");
    let src = std::path::PathBuf::from(smollm2());
    let labelled = dir.path("labelled.gguf");
    let unlabelled = dir.path("unlabelled.gguf");
    // SmolLM2's file says 3 (Q4_1); 15 (Q4_K_M) shows the label comes from the key.
    rewrite_gguf(&src, &labelled, |kvs| set_key(kvs, "general.file_type", MetadataValue::U32(15)));
    rewrite_gguf(&src, &unlabelled, |kvs| kvs.retain(|(k, _)| k != "general.file_type"));
    let bench = |path: &std::path::Path| {
        let (ok, out, err) = cera(&["bench", "-m", path.to_str().unwrap(), "-p", "8", "-n", "2", "-r", "1", "--device", "cpu"]);
        assert!(ok, "{err}");
        out
    };
    let out = bench(&src);
    assert!(out.contains("| SmolLM2-135M-Instruct.Q4_1.gguf | Q4_1 |"), "{out}");
    assert!(out.contains("| model | quant | size | test | tok/s | ms/tok | weights/tok | GB/s |\n"), "{out}");
    assert!(!out.contains("roofline") && !out.contains("dispatches") && !out.contains("host µs"), "{out}");
    assert!(bench(&labelled).contains("| labelled.gguf | Q4_K_M |"));
    // Without the key: the format of most of the weights a decode step reads.
    let out = bench(&unlabelled);
    assert!(out.contains("| unlabelled.gguf | Q4_1 |"), "{out}");
    let err = refused(&["bench", "-m", src.to_str().unwrap(), "--device", "cpu", "--profile"]);
    assert!(err.contains("--profile times the GPU's kernels: it needs a GPU run (not --device cpu)"), "{err}");
}

#[test]
fn models_are_found_or_the_error_says_why() {
    let dir = TempDir::new("finding");
    // A folder with one .gguf (and no config.json) is that file.
    let one = dir.path("one");
    std::fs::create_dir(&one).unwrap();
    tiny_model(&one.join("tiny.gguf"), 1);
    std::fs::write(one.join("README.md"), "a model").unwrap();
    let (ok, out, err) = cera(&["inspect", "-m", one.to_str().unwrap()]);
    assert!(ok && out.contains("tiny.gguf") && out.contains("name:                tiny"), "{err}");
    // Several: an error listing them.
    tiny_model(&one.join("other.gguf"), 1);
    let err = refused(&["inspect", one.to_str().unwrap()]);
    assert!(err.contains("2 .gguf files, pass one with -m: other.gguf, tiny.gguf"), "{err}");
    // An unknown name lists the known ones.
    let err = refused(&["run", "-m", "llama-3-8b", "hi"]);
    assert_eq!(err.trim_end(), "error: llama-3-8b: no such file or folder, and not a known model name (known: smollm2-135m, gemma3-270m)");
    // A truncated file says so, with the size it needs and the size it has.
    let full = dir.path("full.gguf");
    tiny_model(&full, 4);
    let bytes = std::fs::read(&full).unwrap();
    let cut = dir.path("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
    let err = refused(&["inspect", cut.to_str().unwrap()]);
    let sizes = err.split("its tensors need ").nth(1).unwrap_or_else(|| panic!("{err}"));
    let nums: Vec<u64> = sizes.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).take(2).map(|s| s.parse().unwrap()).collect();
    assert!(err.contains("the file is truncated"), "{err}");
    assert_eq!(nums[1], bytes.len() as u64 - 20, "{err}");
    assert!(nums[0] > nums[1] && nums[0] <= bytes.len() as u64, "{err}");
}

#[test]
fn a_context_past_the_trained_one_warns() {
    let dir = TempDir::new("trained-ctx");
    let short = dir.path("short-ctx.gguf");
    rewrite_gguf(std::path::Path::new(&smollm2()), &short, |kvs| set_key(kvs, "llama.context_length", MetadataValue::U32(64)));
    let s = short.to_str().unwrap();
    let (ok, _, err) = cera(&["run", "-m", s, "--device", "cpu", "-n", "1", "--temp", "0", "-c", "128", "--raw", "Hello"]);
    assert!(ok, "{err}");
    assert!(err.contains("warning: -c 128 is past the model's trained context of 64 positions"), "{err}");
    let (ok, _, err) = cera(&["run", "-m", s, "--device", "cpu", "-n", "1", "--temp", "0", "-c", "64", "--raw", "Hello"]);
    assert!(ok && !err.contains("warning"), "{err}");
}

#[test]
fn an_adapter_choice_that_matches_nothing_lists_the_adapters() {
    let m = smollm2();
    let out = Command::new(env!("CARGO_BIN_EXE_cera"))
        .args(["run", "-m", &m, "--device", "gpu", "-n", "1", "hi"])
        .env("NUMR_ADAPTER", "no-such-adapter")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("panicked"), "{err}");
    assert!(err.contains("no GPU adapter matches `no-such-adapter` (NUMR_ADAPTER: a name substring or an index); found: "), "{err}");
    let found = err.split("found: ").nth(1).unwrap().trim_end();
    let listed = numr::GpuContext::list_adapters();
    assert!(found == "none" || found.split("; ").all(|a| listed.iter().any(|l| l == a)), "{found} vs {listed:?}");
}

/// Gemma 3 270M is a base model without a chat template: run and chat warn, once, that the
/// built-in format is used; `--raw` does not.
#[test]
fn a_model_without_a_chat_template_warns() {
    let g = gemma3();
    let warning = "warning: the model has no chat template; using the built-in `gemma` format (for a base model, --raw sends the prompt as it is)";
    let (ok, _, err) = cera(&["run", "-m", &g, "--device", "cpu", "-n", "2", "--temp", "0", "Hello"]);
    assert!(ok && err.matches(warning).count() == 1, "{err}");
    let (ok, _, err) = cera_with_stdin(&["chat", "-m", &g, "--device", "cpu", "-n", "2", "--temp", "0"], "Hello\nAgain\n");
    assert!(ok && err.matches(warning).count() == 1, "{err}");
    // The README's example: a base model continues the text.
    let (ok, out, err) = cera(&["run", "-m", &g, "--raw", "--device", "cpu", "-n", "24", "--temp", "0", "Once upon a time, there was"]);
    assert!(ok && !err.contains("warning"), "{err}");
    assert!(out.split_whitespace().count() >= 8, "{out:?}");
}

/// `-d`: every test at each depth, named as llama-bench names them; the JSON carries the depth.
/// `--cold-start N`: the load and the process's first request of `N` prompt tokens, which sizes
/// the context when it is longer than every test.
#[test]
fn bench_runs_every_test_at_each_depth() {
    let m = smollm2();
    let (ok, out, err) = cera(&["bench", "-m", &m, "-p", "8", "-n", "2", "-d", "0,24", "-r", "1", "--device", "cpu", "--cold-start", "48", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let rows: Vec<(String, u64)> =
        v["rows"].as_array().unwrap().iter().map(|r| (r["test"].as_str().unwrap().to_string(), r["depth"].as_u64().unwrap())).collect();
    let want = [("pp8", 0), ("tg2", 0), ("pp8 @ d24", 24), ("tg2 @ d24", 24)].map(|(t, d)| (t.to_string(), d));
    assert_eq!(rows, want);
    assert!(v["rows"].as_array().unwrap().iter().all(|r| r["tok_s"]["median"].as_f64().unwrap() > 0.0), "{out}");
    let cold = &v["cold"][0];
    assert_eq!(cold["prompt"], 48, "{out}");
    assert!(cold["load_s"].as_f64().unwrap() > 0.0 && cold["load_gb_s"].as_f64().unwrap() > 0.0, "{out}");
    assert!(cold["ttft_ms"].as_f64().unwrap() > 0.0 && cold["prefill_tok_s"].as_f64().unwrap() > 0.0, "{out}");
    let (ok, out, err) = cera(&["bench", "-m", &m, "-p", "16", "-n", "0", "-r", "1", "--device", "cpu", "--cold-start", "16"]);
    assert!(ok, "{err}");
    assert!(out.contains("first request (16 prompt tokens): time to first token") && out.contains("the warm pp16 is"), "{out}");
}

/// `--spec-type ngram` and `--model-draft`: the same text as without them, the stats line and
/// `--json` count the drafts, and bad combinations are refused before anything loads.
#[test]
fn speculative_decoding_flags() {
    let m = smollm2();
    let prompt = "Repeat exactly: red, green, blue, red, green, blue, red, green, blue, red, green,";
    let mut args = vec!["run", "-m", &m];
    args.extend(GREEDY_CPU);
    args.push("--raw");
    let plain = cera(&[&args[..], &["--json", prompt]].concat());
    assert!(plain.0, "{}", plain.2);
    let plain: serde_json::Value = serde_json::from_str(&plain.1).unwrap();
    for extra in [&["--spec-type", "ngram", "--draft-max", "4"][..], &["--model-draft", &m, "--draft-max", "3"][..]] {
        let (ok, out, err) = cera(&[&args[..], extra, &["--json", prompt]].concat());
        assert!(ok, "{extra:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["generated_ids"], plain["generated_ids"], "{extra:?}");
        let t = &v["timings"];
        assert!(t["draft_tokens"].as_u64().unwrap() > 0 && t["accepted_tokens"].as_u64().unwrap() > 0, "{extra:?}: {t}");
        assert!(t["decode_steps"].as_u64().unwrap() < plain["timings"]["decode_steps"].as_u64().unwrap(), "{extra:?}: {t}");
        let (ok, _, err) = cera(&[&args[..], extra, &[prompt]].concat());
        assert!(ok && err.contains(" accepted (") && err.contains("tokens per step"), "{extra:?}: {err}");
    }
    let err = refused(&["run", "--spec-type", "ngram", "--draft-max", "17", "hi"]);
    assert!(err.contains("--draft-max / --draft-min") && err.contains("draft_max <= 16"), "{err}");
    let err = refused(&["run", "--spec-type", "ngram", "--model-draft", &m, "hi"]);
    assert!(err.contains("choose one drafter"), "{err}");
    let err = refused(&["run", "-m", &m, "--model-draft", "no-such-model.gguf", "hi"]);
    assert!(err.contains("no-such-model.gguf"), "{err}");
}

/// `cera bench --concurrency --grammar`: every request under a Lark grammar, its masks applied by
/// the executor; the note reports their host cost. Each concurrency runs on a batcher of that
/// many sequences. Without `--concurrency` it is refused.
#[test]
fn bench_grammar_constrains_the_concurrency_workload() {
    let m = smollm2();
    let (ok, out, err) = cera(&[
        "bench",
        "-m",
        &m,
        "--device",
        "cpu",
        "--threads",
        "2",
        "--concurrency",
        "1,2",
        "--requests",
        "1",
        "--ctx-size",
        "160",
        "--grammar",
        "start: /(.|\\n)*/",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("the grammar's masks: ") && err.contains(" µs each on the host"), "{err}");
    assert!(out.contains("| 1 | 1 |") && out.contains("| 2 | 1 |"), "{out}");
    // Each run on a batcher of its own concurrency, as llama.cpp's server gets `-np N`.
    for c in [1, 2] {
        assert!(err.contains(&format!("concurrency {c}: 1 requests, a batcher of {c} sequences, ")), "{err}");
    }
    let err = refused(&["bench", "-m", &m, "--grammar", "start: /a/"]);
    assert!(err.contains("--grammar constrains the --concurrency workload"), "{err}");
}

/// `cera bench --concurrency` with speculative decoding: n-gram drafts, and SmolLM2 drafting for
/// itself through the batcher's draft model; the drafts kept are reported under the table.
/// `cera bench --concurrency --http`: the workload through `cera serve` over HTTP (a server of
/// `--parallel c` for each concurrency `c`), every token of every request generated (through
/// end-of-generation tokens) and counted from the usage.
#[cfg(feature = "server")]
#[test]
fn bench_http_concurrency_workload() {
    let m = smollm2();
    let args = ["bench", "-m", &m, "--device", "cpu", "--threads", "2", "--concurrency", "1,2", "--requests", "2", "--ctx-size", "140", "--http", "--json"];
    let (ok, out, err) = cera(&args);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(v["model"].as_str().unwrap().contains("through cera serve (HTTP)"), "{v}");
    // The workload's two requests at a context of 140: outputs of 128 and 139 tokens.
    let want = 128 + 139;
    let rows = v["cera"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        let generated = r["total_tok_s"].as_f64().unwrap() * r["seconds"].as_f64().unwrap();
        assert!((generated - want as f64).abs() < 1e-6, "{r}");
        assert!(r["ttft_p50_ms"].as_f64().unwrap() > 0.0 && r["itl_p50_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
    // A server per concurrency, with `--parallel` that concurrency.
    assert_eq!(err.matches("cera serve ready: ").count(), 2, "{err}");
    // In-process, the batcher's own count of prompt tokens leaves out the untimed warm-up
    // request: the workload's prompts, as the HTTP rows count them.
    let (ok, out2, err2) = cera(&args[..args.len() - 2].iter().copied().chain(["--json"]).collect::<Vec<_>>());
    assert!(ok, "{err2}");
    let v2: serde_json::Value = serde_json::from_str(&out2).unwrap_or_else(|e| panic!("{e}: {out2}"));
    let prefill = |v: &serde_json::Value| v["cera"].as_array().unwrap().iter().map(|r| r["prefill_tokens"].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!(prefill(&v2), prefill(&v), "{out2}");
    for c in [1, 2] {
        assert!(err.contains(&format!("cera serve --parallel {c}: 2 requests over HTTP")), "{err}");
    }
    let err = refused(&["bench", "-m", &m, "--http"]);
    assert!(err.contains("give --concurrency too"), "{err}");
}

#[test]
fn bench_speculative_concurrency_workload() {
    let m = smollm2();
    let base = ["bench", "-m", &m, "--device", "cpu", "--threads", "2", "--concurrency", "1", "--requests", "1", "--ctx-size", "160"];
    for extra in [&["--spec-type", "ngram"][..], &["--model-draft", &m, "--draft-max", "3"][..]] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let (ok, out, err) = cera(&args);
        assert!(ok, "{extra:?}: {err}");
        assert!(out.contains("| 1 | 1 |"), "{out}");
        if extra[0] == "--model-draft" {
            assert!(out.contains("1 streams: ") && out.contains(" drafts kept ("), "{extra:?}: {out}");
        }
    }
    let err = refused(&["bench", "-m", &m, "--spec-type", "ngram"]);
    assert!(err.contains("apply to the --concurrency workload"), "{err}");
}

/// `cera devices` lists what `--devices` picks by index; a bad split is refused with its reason
/// before anything is uploaded, and two devices of the test adapter generate what one does.
#[test]
fn devices_are_listed_and_a_split_is_checked() {
    let (ok, out, err) = cera(&["devices"]);
    assert!(ok && !err.contains("panicked"), "{err}");
    assert_eq!(out.lines().map(str::to_string).collect::<Vec<_>>(), numr::GpuContext::list_adapters());
    let m = smollm2();
    let err = refused(&["run", "-m", &m, "--devices", "0,0", "--tensor-split", "0,1", "-n", "1", "hi"]);
    assert!(err.contains("--tensor-split 0,1 leaves device 0 with no layers (the model has 30"), "{err}");
    let err = refused(&["run", "-m", &m, "--tensor-split", "1,1", "-n", "1", "hi"]);
    assert!(err.contains("--tensor-split needs --devices"), "{err}");
    let err = refused(&["run", "-m", &m, "--devices", "no-such-adapter,0", "-n", "1", "hi"]);
    assert!(err.contains("adapter `no-such-adapter`"), "{err}");
    let Some(ctx) = numr::testing::test_gpu() else { return };
    // A part of the adapter's name without the list's commas (`llvmpipe (LLVM 15.0.6, 256 bits)`).
    let name = ctx.capabilities().adapter_name.split([',', '(']).next().unwrap_or_default().trim().to_string();
    let generate = |extra: &[&str]| {
        let mut args = vec!["run", "-m", &m, "--device", "gpu", "--temp", "0", "-n", "6", "--json", "The capital of France is"];
        args.extend_from_slice(extra);
        let (ok, out, err) = cera(&args);
        assert!(ok, "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        (v["generated_ids"].clone(), v["device"].as_str().unwrap_or_default().to_string())
    };
    let (one, _) = generate(&[]);
    let two_devices = format!("{name},{name}");
    let (two, device) = generate(&["--devices", &two_devices, "--tensor-split", "1,3"]);
    assert_eq!(two, one);
    assert!(device.contains("(layers 0-7) + ") && device.contains("(layers 8-29)"), "{device}");
}
