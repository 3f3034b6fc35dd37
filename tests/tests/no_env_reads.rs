//! The libraries read no environment variable beyond an explicit allowance: numr's adapter
//! choice (`NUMR_ADAPTER`, `NUMR_BACKEND`) and the tests' opt-out, cera's model cache location
//! (`CERA_MODEL_CACHE`, `HOME`), and the app parts of cera (its CLI, its bench, `main.rs`).
//! Tuning is data (`cera::GpuTuning` in `LoadOptions`), never an environment variable read deep
//! inside. Every source file of numr/src, boostr/src and cera/src is scanned for calls of
//! `env::var`, `env::var_os`, `env::vars` and `env::vars_os`.

use std::path::{Path, PathBuf};

/// Files (or folders, ending in `/`) and the variables they may read (`*`: any).
const ALLOWED: &[(&str, &[&str])] = &[
    ("numr/src/gpu/context.rs", &["\"NUMR_ADAPTER\"", "\"NUMR_BACKEND\""]),
    // The GPU tests' opt-out (`NUMR_ALLOW_NO_GPU`) and the H200 run's switch that fails every
    // skipped path (`NUMR_REQUIRE_ALL_PATHS`), through these constants.
    ("numr/src/testing.rs", &["ALLOW_NO_GPU", "REQUIRE_ALL_PATHS"]),
    ("cera/src/fetch.rs", &["\"CERA_MODEL_CACHE\"", "\"HOME\""]),
    ("cera/src/cli/", &["*"]),
    ("cera/src/bench/", &["*"]),
    ("cera/src/main.rs", &["*"]),
];

/// One read: line (1-based) and the call's first argument as written.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    line: usize,
    var: String,
}

/// The environment reads in `src` (comment lines skipped).
fn reads(src: &str) -> Vec<Read> {
    let mut out = Vec::new();
    for (i, line) in src.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("env::var") {
            let after = &rest[at + "env::var".len()..];
            // `var(`, `var_os(`, `vars(`, `vars_os(`, or a `use` of them.
            let name_end = after.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(after.len());
            let tail = &after[name_end..];
            if matches!(&after[..name_end], "" | "_os" | "s" | "s_os") {
                let var = match tail.strip_prefix('(') {
                    Some(args) => args[..args.find([')', ','].as_slice()).unwrap_or(args.len())].trim().to_string(),
                    None => "(imported)".to_string(),
                };
                out.push(Read { line: i + 1, var });
            }
            rest = after;
        }
    }
    out
}

fn allowed(path: &str, var: &str) -> bool {
    ALLOWED.iter().any(|(p, vars)| {
        let here = if p.ends_with('/') { path.starts_with(p) } else { path == *p };
        here && vars.iter().any(|v| *v == "*" || *v == var)
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_scanner_finds_every_form_of_a_read() {
    let src = "let a = std::env::var(\"A\");\n// std::env::var(\"COMMENT\")\nlet b = env::var_os(NAME).map(f); let c = std::env::vars();\nuse std::env::var;\nlet d = env::variable();";
    let got = reads(src);
    let want = [(1, "\"A\""), (3, "NAME"), (3, ""), (4, "(imported)")];
    assert_eq!(got, want.map(|(line, var)| Read { line, var: var.to_string() }));
    assert!(allowed("cera/src/cli/run.rs", "\"ANY\""));
    assert!(allowed("numr/src/gpu/context.rs", "\"NUMR_ADAPTER\""));
    assert!(!allowed("numr/src/gpu/context.rs", "\"WGPU_BACKEND\""));
    assert!(!allowed("cera/src/engine/gpu/tuning.rs", "\"CERA_Q8_ROWS\""));
}

#[test]
fn the_libraries_read_only_the_allowed_variables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in ["numr/src", "boostr/src", "cera/src"] {
        rust_files(&root.join(krate), &mut files);
    }
    assert!(files.len() > 100, "only {} source files found under {}", files.len(), root.display());
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        let src = std::fs::read_to_string(f).unwrap();
        for r in reads(&src) {
            if !allowed(&rel, &r.var) {
                bad.push(format!("{rel}:{} reads the environment variable {}", r.line, r.var));
            }
        }
    }
    assert!(bad.is_empty(), "library code reads environment variables outside the allowance (make them options):\n{}", bad.join("\n"));
}
