//! How `cera run` and `cera chat` take their input, end to end: prompts from files and pipes,
//! Ctrl-C in `run`, the chat's multi-line messages and context trimming through a pipe, and
//! its line editor, history and Ctrl-C in a pseudo-terminal.
//!
//! Generation runs SmolLM2 on the CPU path, greedy; the terminal tests that need no real text
//! run the tiny llama checkpoint of `tests/golden/hf/`. Every wait on the child is bounded by a
//! generous watchdog that fails the test instead of hanging it; none is a timed assert.

#![cfg(feature = "cli")]

mod cli_support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use cera::chat_template::ChatMessage;
use cera::engine::{DeviceChoice, Engine, LoadOptions};
use cli_support::*;
use serde_json::Value;

/// How long any wait on a child may take before the test fails (far above what it needs).
const WATCHDOG: Duration = Duration::from_secs(120);

const SKY: &str = "Why is the sky blue?";

/// `cera run -m SmolLM2 GREEDY_CPU --json ARGS [stdin]`: the JSON object.
fn run_json(args: &[&str], stdin: Option<&str>) -> Value {
    let m = smollm2();
    let mut all = vec!["run", "-m", &m, "--json"];
    all.extend(GREEDY_CPU);
    all.extend(args);
    let (ok, out, err) = match stdin {
        Some(input) => cera_with_stdin(&all, input),
        None => cera(&all),
    };
    assert!(ok, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[test]
fn run_prompt_from_a_file_or_standard_input() {
    let dir = TempDir::new("prompt-file");
    let reference = run_json(&[SKY], None);
    assert_eq!(reference["prompt_ids"], golden_chat_single()["prompt_ids"]);
    let ids = |v: &Value| (v["prompt_ids"].clone(), v["generated_ids"].clone());
    // An editor's file ends with a line end, `echo` too: one is dropped, so all are the same.
    let file = dir.path("prompt.txt");
    let crlf = dir.path("prompt-crlf.txt");
    std::fs::write(&file, format!("{SKY}\n")).unwrap();
    std::fs::write(&crlf, format!("{SKY}\r\n")).unwrap();
    let (f, c) = (file.to_str().unwrap(), crlf.to_str().unwrap());
    let piped = format!("{SKY}\n");
    let cases: [(&[&str], Option<&str>); 6] = [
        (&["-f", f], None),
        (&["--file", c], None),
        (&[], Some(&piped)),
        (&["-"], Some(&piped)),
        (&["-f", "-"], Some(SKY)),
        (&["-p", SKY], Some("ignored: a prompt was given")),
    ];
    for (args, stdin) in cases {
        assert_eq!(ids(&run_json(args, stdin)), ids(&reference), "{args:?} with {stdin:?}");
    }
    // Only one line end is dropped: the rest of the file is the prompt as it is (--raw shows it).
    let raw = |args: &[&str], stdin: Option<&str>| run_json(&[&["--raw"][..], args].concat(), stdin)["prompt_ids"].clone();
    let two = dir.path("two-newlines.txt");
    std::fs::write(&two, "The capital of France is\n\n").unwrap();
    let with_newline = raw(&["The capital of France is\n"], None);
    assert_ne!(with_newline, raw(&["The capital of France is"], None));
    assert_eq!(raw(&["-f", two.to_str().unwrap()], None), with_newline);
    assert_eq!(raw(&[], Some("The capital of France is\n\n")), with_newline);
    // `-p -` is the text `-`, as llama.cpp takes it.
    let dash = raw(&["-p", "-"], Some("The capital of France is"));
    assert_eq!(dash.as_array().map(Vec::len), Some(1), "{dash}");
}

#[test]
fn run_prompt_input_errors_are_clear() {
    let dir = TempDir::new("prompt-errors");
    let missing = dir.path("missing.txt");
    let m = missing.to_str().unwrap();
    let d = dir.0.to_str().unwrap();
    let latin1 = dir.path("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait").unwrap();
    let l = latin1.to_str().unwrap();
    let blank = dir.path("blank.txt");
    std::fs::write(&blank, " \n\t\n").unwrap();
    let b = blank.to_str().unwrap();
    let no_prompt = "error: no prompt: give it as an argument, with -p TEXT or -f FILE, or through standard input";
    // Each is refused before the model loads (the default model is never looked at).
    let cases: [(&[&str], &str, &str); 11] = [
        (&["-f", m], "", &format!("error: {m}: cannot read the prompt: ")),
        (&["-f", d], "", &format!("error: {d}: cannot read the prompt: ")),
        (&["-f", l], "", &format!("error: {l}: the prompt is not UTF-8 text (an invalid byte at offset 3)")),
        (&[], "caf\u{e9}", "error: standard input: the prompt is not UTF-8 text (an invalid byte at offset 3)"),
        (&["-f", b], "", &format!("error: {b}: the prompt is empty")),
        (&["-"], "\n", "error: standard input: the prompt is empty"),
        (&[""], "", "error: the prompt is empty"),
        (&[], "", &format!("{no_prompt} (standard input was empty)")),
        (&["hi", "-f", m], "", "error: the argument '[PROMPT]' cannot be used with '--file <FILE>'"),
        (&["-p", "hi", "-f", m], "", "error: the argument '--prompt <PROMPT>' cannot be used with '--file <FILE>'"),
        (&["hi", "-p", "hi"], "", "error: the argument '[PROMPT]' cannot be used with '--prompt <PROMPT>'"),
    ];
    for (args, stdin, want) in cases {
        let all = [&["run"][..], args].concat();
        let (ok, out, err) = if stdin == "caf\u{e9}" {
            // Latin-1 bytes through the pipe.
            let mut child =
                Command::new(env!("CARGO_BIN_EXE_cera")).args(&all).stdin(Stdio::piped()).stderr(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
            // The child may stop reading early (an error): a broken pipe is its answer.
            let _ = child.stdin.take().unwrap().write_all(b"caf\xe9");
            let o = child.wait_with_output().unwrap();
            (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
        } else {
            cera_with_stdin(&all, stdin)
        };
        assert!(!ok && out.is_empty() && !err.contains("panicked"), "{args:?}: {err}");
        assert!(err.starts_with(want), "{args:?}: want {want:?}, got {err:?}");
    }
    // `cera()` gives no standard input at all (/dev/null): the same as an empty pipe.
    let (ok, _, err) = cera(&["run"]);
    assert!(!ok && err.trim_end() == format!("{no_prompt} (standard input was empty)"), "{err}");
}

/// Ctrl-C in `cera run`: these tests read /proc/PID/status to know when the handler is there.
#[cfg(target_os = "linux")]
mod run_ctrl_c {
    use std::io::Read;
    use std::process::{Child, ChildStdin};
    use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
    use std::time::Instant;

    use super::*;

    /// A `cera` child with its outputs read on threads: stdout in chunks, stderr in lines.
    struct Running {
        child: Child,
        stdin: Option<ChildStdin>,
        stdout: Receiver<Vec<u8>>,
        stderr: Receiver<String>,
    }

    impl Running {
        fn spawn(args: &[&str]) -> Running {
            let mut child =
                Command::new(env!("CARGO_BIN_EXE_cera")).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            let (out_tx, stdout) = channel();
            let mut out = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = out.read(&mut buf) {
                    if out_tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            });
            let (err_tx, stderr) = channel();
            let err = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(err)).map_while(Result::ok) {
                    if err_tx.send(line).is_err() {
                        break;
                    }
                }
            });
            let stdin = child.stdin.take();
            Running { child, stdin, stdout, stderr }
        }

        /// Fails the test (and kills the child) past the watchdog.
        fn check(&mut self, start: Instant, what: &str) {
            if start.elapsed() > WATCHDOG {
                let _ = self.child.kill();
                panic!("watchdog: {what} took over {WATCHDOG:?}");
            }
        }

        /// Waits until the child catches SIGINT (bit 1 of SigCgt in /proc/PID/status).
        fn wait_for_sigint_handler(&mut self) {
            let start = Instant::now();
            let status = format!("/proc/{}/status", self.child.id());
            loop {
                let text = std::fs::read_to_string(&status).unwrap();
                let caught = text.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap()).unwrap();
                if caught & (1 << (2 - 1)) != 0 {
                    return;
                }
                assert!(self.child.try_wait().unwrap().is_none(), "cera ended before catching SIGINT");
                self.check(start, "installing the Ctrl-C handler");
                std::thread::yield_now();
            }
        }

        fn sigint(&self) {
            let ok = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status().unwrap().success();
            assert!(ok, "kill -INT");
        }

        /// The next stdout chunk.
        fn first_output(&mut self) -> Vec<u8> {
            self.stdout.recv_timeout(WATCHDOG).unwrap_or_else(|e| {
                let _ = self.child.kill();
                panic!("watchdog: no output: {e}")
            })
        }

        /// Waits for a stderr line containing `want`; returns the lines up to it.
        fn stderr_until(&mut self, want: &str) -> Vec<String> {
            let mut lines = Vec::new();
            loop {
                match self.stderr.recv_timeout(WATCHDOG) {
                    Ok(line) => {
                        let done = line.contains(want);
                        lines.push(line);
                        if done {
                            return lines;
                        }
                    }
                    Err(e) => {
                        let _ = self.child.kill();
                        panic!("watchdog: no stderr line with {want:?} ({e}): {lines:?}");
                    }
                }
            }
        }

        /// Closes stdin, reads everything else and waits: (exit code, stdout, stderr lines).
        fn finish(mut self, mut stdout: Vec<u8>, mut stderr: Vec<String>) -> (Option<i32>, String, Vec<String>) {
            drop(self.stdin.take());
            let start = Instant::now();
            loop {
                match self.stdout.recv_timeout(WATCHDOG.saturating_sub(start.elapsed())) {
                    Ok(chunk) => stdout.extend(chunk),
                    Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => self.check(start, "the output after Ctrl-C"),
                }
            }
            loop {
                match self.stderr.recv_timeout(WATCHDOG.saturating_sub(start.elapsed())) {
                    Ok(line) => stderr.push(line),
                    Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => self.check(start, "the stats line after Ctrl-C"),
                }
            }
            let status = loop {
                if let Some(s) = self.child.try_wait().unwrap() {
                    break s;
                }
                self.check(start, "the end after Ctrl-C");
                std::thread::yield_now();
            };
            (status.code(), String::from_utf8(stdout).unwrap(), stderr)
        }
    }

    /// The stats line among stderr's lines.
    fn stats(lines: &[String]) -> &String {
        lines.iter().find(|l| l.contains("tok/s")).unwrap_or_else(|| panic!("no stats line: {lines:?}"))
    }

    #[test]
    fn run_ctrl_c_before_the_generation_still_prints_the_whole_json() {
        let m = smollm2();
        let mut r = Running::spawn(&["run", "-m", &m, "--device", "cpu", "--temp", "0", "-n", "-1", "--ignore-eos", "--json", "-f", "-"]);
        r.stdin.as_mut().unwrap().write_all(SKY.as_bytes()).unwrap();
        // The handler is there before the prompt is read (the child waits on stdin): Ctrl-C now
        // comes before the model loads, and the note says it was taken.
        r.wait_for_sigint_handler();
        r.sigint();
        let before = r.stderr_until("(Ctrl-C: stopping before the generation starts)");
        let (code, out, err) = r.finish(Vec::new(), before);
        assert_eq!(code, Some(130), "{err:?}");
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert_eq!(v["finish_reason"], "cancelled");
        assert_eq!(v["prompt_ids"], golden_chat_single()["prompt_ids"]);
        assert_eq!(v["generated_ids"], Value::Array(Vec::new()));
        assert_eq!((v["text"].as_str(), v["timings"]["generated_tokens"].as_u64(), v["timings"]["prefill_tokens"].as_u64()), (Some(""), Some(0), Some(0)));
        let s = stats(&err);
        assert!(s.contains("generated 0 tokens") && s.contains("| cancelled |"), "{s}");
    }

    #[test]
    fn run_ctrl_c_during_the_generation_ends_the_output() {
        let m = smollm2();
        // The greedy run's first 8 tokens: a cancelled run's output agrees with them as far as
        // both go.
        let reference = run_json(&[SKY], None);
        let (want_text, want_ids) = (reference["text"].as_str().unwrap().to_string(), reference["generated_ids"].as_array().unwrap().clone());
        for json in [false, true] {
            let mut args = vec!["run", "-m", &m, "--device", "cpu", "--temp", "0", "-n", "-1", "--ignore-eos", SKY];
            if json {
                args.push("--json");
            }
            let mut r = Running::spawn(&args);
            r.wait_for_sigint_handler();
            // Text: once the first piece is out. JSON prints at the end only: Ctrl-C at any time.
            let first = if json { Vec::new() } else { r.first_output() };
            r.sigint();
            let (code, out, err) = r.finish(first, Vec::new());
            assert_eq!(code, Some(130), "{err:?}");
            let s = stats(&err);
            assert!(s.contains("| cancelled |"), "{s}");
            let n: usize = s.split("generated ").nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
            if json {
                let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
                assert_eq!(v["finish_reason"], "cancelled");
                assert_eq!(v["generated_ids"].as_array().map(Vec::len), Some(n));
                assert_eq!(v["timings"]["generated_tokens"].as_u64(), Some(n as u64));
                let ids = v["generated_ids"].as_array().unwrap();
                let k = ids.len().min(want_ids.len());
                assert_eq!(ids[..k], want_ids[..k]);
            } else {
                // At least the first piece, and the line ended.
                let text = out.strip_suffix('\n').unwrap_or_else(|| panic!("the line is not ended: {out:?}"));
                assert!(n >= 1 && !text.is_empty(), "{n} tokens: {out:?}");
                assert!(want_text.starts_with(text) || text.starts_with(&want_text), "{out:?} against {want_text:?}");
            }
        }
    }
}

/// `cera chat -m SmolLM2 ARGS` with `input` piped: (stdout, stderr), checked successful.
fn chat(args: &[&str], input: &str) -> (String, String) {
    let m = smollm2();
    let all = [&["chat", "-m", &m, "--device", "cpu", "--temp", "0"][..], args].concat();
    let (ok, out, err) = cera_with_stdin(&all, input);
    assert!(ok && !err.contains("error"), "{err}");
    (out, err)
}

/// The prompt token counts of the stats lines.
fn prompt_tokens(stderr: &str) -> Vec<usize> {
    stderr.lines().filter(|l| l.contains("tok/s")).map(|l| l.split("prompt ").nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap()).collect()
}

#[test]
fn chat_multi_line_messages_through_a_pipe() {
    let two_lines = "line one\nline two";
    let reference = run_json(&["-p", two_lines], None);
    let n_prompt = reference["timings"]["prompt_tokens"].as_u64().unwrap() as usize;
    let want_reply = reference["text"].as_str().unwrap();
    // `"""` on its own lines, `"""` around text, and a final `\`; `/reset` between them, so each
    // is the first turn; a `/exit` inside `"""` is text, not the command.
    let input = "\"\"\"\nline one\nline two\n\"\"\"\n/reset\n\"\"\"line one\nline two\"\"\"\n/reset\nline one\\\nline two\n/reset\n\"\"\"\n/exit\n\"\"\"\n";
    let (out, err) = chat(&["-n", "8"], input);
    assert!(out.starts_with(&format!("{want_reply}\n").repeat(3)), "the same greedy reply as `cera run` with the two-line prompt: {out:?}");
    let counts = prompt_tokens(&err);
    assert_eq!(counts.len(), 4, "{err}");
    assert_eq!(counts[..3], [n_prompt; 3], "{err}");
    assert_eq!(counts[3], run_json(&["-p", "/exit"], None)["timings"]["prompt_tokens"].as_u64().unwrap() as usize);
}

/// The rule of the chat's trimming, written again: drop the oldest (user, reply) pairs until
/// the rendered conversation leaves `min(n_predict, n_ctx / 4)` positions free.
struct Trimmer {
    engine: Engine,
    system: String,
    kept: Vec<(String, String)>,
    reserve: usize,
}

impl Trimmer {
    fn count(&self, kept: &[(String, String)], user: &str) -> usize {
        let mut msgs = vec![ChatMessage::new("system", self.system.clone())];
        for (u, a) in kept {
            msgs.push(ChatMessage::new("user", u.clone()));
            msgs.push(ChatMessage::new("assistant", a.clone()));
        }
        msgs.push(ChatMessage::new("user", user));
        let text = self.engine.chat_template().render(&msgs, true).unwrap();
        let mut s = self.engine.session().unwrap();
        s.append_text(&text).unwrap()
    }

    /// (prompt tokens, turns dropped) of the next message.
    fn next(&mut self, user: &str) -> (usize, usize) {
        let mut dropped = 0;
        loop {
            let n = self.count(&self.kept[dropped..], user);
            if n + self.reserve <= self.engine.n_ctx() {
                self.kept.drain(..dropped);
                return (n, dropped);
            }
            dropped += 1;
        }
    }
}

#[test]
fn chat_drops_the_oldest_turns_when_the_context_fills() {
    let system = "You are a terse assistant. Answer in one short sentence.";
    let questions = [
        "What is 2+2?",
        "Name a color.",
        "Name a fruit.",
        "Name a city.",
        "Name an animal.",
        "Name a planet.",
        "Name a river.",
        "Name a metal.",
        "Name a flower.",
        "Name a tree.",
    ];
    // -c 160, -n 16: 16 positions kept free; each turn stops at its first line end, so that the
    // replies can be read back from standard output line by line.
    let (out, err) = chat(&["-c", "160", "-n", "16", "--stop", "\n", "--system", system], &(questions.join("\n") + "\n"));
    let replies: Vec<&str> = out.lines().collect();
    assert_eq!(replies.len(), questions.len(), "every turn is answered: {out:?}\n{err}");
    let counts = prompt_tokens(&err);
    assert_eq!(counts.len(), questions.len(), "{err}");
    let engine = Engine::load(smollm2(), &LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(160), ..Default::default() }, None).unwrap();
    let mut rule = Trimmer { engine, system: system.into(), kept: Vec::new(), reserve: 16 };
    let mut notes = Vec::new();
    let mut total_dropped = 0;
    for (i, q) in questions.iter().enumerate() {
        let (n, dropped) = rule.next(q);
        assert_eq!(counts[i], n, "turn {i}: the system message and the kept turns\n{err}");
        if dropped > 0 {
            notes.push(if dropped == 1 {
                "(context full: dropped the oldest turn)".to_string()
            } else {
                format!("(context full: dropped the {dropped} oldest turns)")
            });
        }
        total_dropped += dropped;
        rule.kept.push((q.to_string(), replies[i].trim().to_string()));
    }
    assert!(total_dropped >= 3, "the test must fill the context: {counts:?}");
    let got: Vec<&str> = err.lines().filter(|l| l.starts_with("(context full")).collect();
    assert_eq!(got, notes, "{err}");
}

#[test]
fn chat_message_over_the_context_is_an_error_for_its_turn_only() {
    let long = "word ".repeat(200);
    let (ok, out, err) = {
        let m = smollm2();
        cera_with_stdin(&["chat", "-m", &m, "--device", "cpu", "--temp", "0", "-c", "160", "-n", "8"], &format!("{long}\nWhat is 2+2?\n"))
    };
    assert!(ok, "{err}");
    let e: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(e.len(), 1, "{err}");
    assert!(e[0].contains("with 8 kept for the reply do not fit the context of 160 positions (a longer context: -c/--ctx-size)"), "{}", e[0]);
    assert_eq!(prompt_tokens(&err).len(), 1, "the next message is answered: {err}");
    assert_eq!(out.lines().count(), 1, "{out:?}");
}

/// The chat in a pseudo-terminal: the line editor, its history, and Ctrl-C.
#[cfg(unix)]
mod terminal {
    use rexpect::process::WaitStatus;
    use rexpect::session::{PtySession, spawn_command};

    use super::*;

    const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/golden/hf/llama-tiny");

    /// `cera chat MODEL ARGS` in a terminal, with its history in `data` (XDG_DATA_HOME), at the
    /// first prompt.
    fn chat_in_terminal(model: &str, args: &[&str], data: &std::path::Path) -> PtySession {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cera"));
        cmd.args(["chat", "-m", model, "--device", "cpu", "--temp", "0"]).args(args).env("XDG_DATA_HOME", data).env("TERM", "xterm");
        let mut p = spawn_command(cmd, Some(WATCHDOG.as_millis() as u64)).unwrap();
        p.exp_string("> ").unwrap();
        p
    }

    fn type_keys(p: &mut PtySession, keys: &str) {
        p.send(keys).unwrap();
        p.flush().unwrap();
    }

    fn exit_code(p: &PtySession) -> i32 {
        match p.process().wait().unwrap() {
            WaitStatus::Exited(_, code) => code,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arrows_edit_the_line() {
        let data = TempDir::new("tty-edit");
        let mut p = chat_in_terminal(TINY, &[], &data.0);
        // `xit`, three times Left, `/e`, Enter: `/exit` (the arrows once inserted `^[[D`).
        type_keys(&mut p, "xit\x1b[D\x1b[D\x1b[D/e\r");
        let rest = p.exp_eof().unwrap();
        assert!(!rest.contains("tok/s") && !rest.contains("unknown command"), "{rest:?}");
        assert_eq!(exit_code(&p), 0);
    }

    #[test]
    fn up_recalls_earlier_lines_and_the_history_is_kept() {
        let data = TempDir::new("tty-history");
        let mut p = chat_in_terminal(TINY, &[], &data.0);
        type_keys(&mut p, "/system hi\r");
        p.exp_string("(system message set)").unwrap();
        p.exp_string("> ").unwrap();
        type_keys(&mut p, "\x1b[A\r");
        p.exp_string("(system message set)").unwrap();
        p.exp_string("> ").unwrap();
        // Ctrl-D on an empty line leaves.
        type_keys(&mut p, "\x04");
        p.exp_eof().unwrap();
        assert_eq!(exit_code(&p), 0);
        let history = std::fs::read_to_string(data.path("cera/chat_history")).unwrap();
        assert!(history.lines().any(|l| l == "/system hi"), "{history:?}");
        // A new chat reads it back: Up gives the line of the last one.
        let mut p = chat_in_terminal(TINY, &[], &data.0);
        type_keys(&mut p, "\x1b[A\r");
        p.exp_string("(system message set)").unwrap();
        type_keys(&mut p, "/exit\r");
        p.exp_eof().unwrap();
        assert_eq!(exit_code(&p), 0);
    }

    #[test]
    fn an_unwritable_history_is_a_note() {
        let data = TempDir::new("tty-no-history");
        // The data folder is a file: the history's folder cannot be made.
        let file = data.path("not-a-folder");
        std::fs::write(&file, "").unwrap();
        let mut p = chat_in_terminal(TINY, &[], &file);
        type_keys(&mut p, "/system hi\r");
        p.exp_string("(the chat history cannot be saved to ").unwrap();
        p.exp_string("(system message set)").unwrap();
        type_keys(&mut p, "/exit\r");
        p.exp_eof().unwrap();
        assert_eq!(exit_code(&p), 0);
    }

    #[test]
    fn ctrl_c_at_the_prompt_twice_leaves() {
        let data = TempDir::new("tty-ctrl-c");
        let mut p = chat_in_terminal(TINY, &[], &data.0);
        // In a `"""` message Ctrl-C drops it; `/exit` is then a command again.
        type_keys(&mut p, "\"\"\"\r");
        p.exp_string("... ").unwrap();
        type_keys(&mut p, "\x03");
        p.exp_string("(message dropped)").unwrap();
        p.exp_string("(Ctrl-C again to leave, or /exit)").unwrap();
        p.exp_string("> ").unwrap();
        type_keys(&mut p, "/exit\r");
        p.exp_eof().unwrap();
        assert_eq!(exit_code(&p), 0);
        // Twice in a row at the prompt: the end, status 130.
        let mut p = chat_in_terminal(TINY, &[], &data.0);
        type_keys(&mut p, "\x03");
        p.exp_string("(Ctrl-C again to leave, or /exit)").unwrap();
        p.exp_string("> ").unwrap();
        type_keys(&mut p, "\x03");
        p.exp_eof().unwrap();
        assert_eq!(exit_code(&p), 130);
    }

    #[test]
    fn ctrl_c_during_a_reply_stops_only_the_reply() {
        let data = TempDir::new("tty-stop");
        let m = smollm2();
        let mut p = chat_in_terminal(&m, &["-n", "-1", "--ignore-eos"], &data.0);
        type_keys(&mut p, "Hi\r");
        // SmolLM2's greedy reply starts with "Hello"; it would go on to the end of the context.
        p.exp_string("Hello").unwrap();
        type_keys(&mut p, "\x03");
        p.exp_string("(stopped)").unwrap();
        let (_, stats) = p.exp_regex(r"\| cancelled \|").unwrap();
        assert!(stats.contains("cancelled"));
        p.exp_string("> ").unwrap();
        type_keys(&mut p, "/exit\r");
        p.exp_eof().unwrap();
        assert_eq!(exit_code(&p), 0);
    }
}
