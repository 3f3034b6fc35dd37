//! The checked values of the numeric flags: each parser takes the text clap read and returns
//! the value, or a message saying what the flag takes, which clap prints as
//! `error: invalid value '-1' for '--temp <T>': ...`.
//!
//! The flags that take these accept a value starting with `-` (`allow_hyphen_values`), so that
//! `--temp -1` reaches its parser and is refused for what it is, where clap alone would take
//! `-1` for a flag and suggest `-- -1`. The sampler's ranges are the library's
//! ([`SamplerOpts::check`](crate::engine::SamplerOpts::check)), which refuses the same values
//! with a typed error.

use std::str::FromStr;

use crate::engine::MAX_TOP_LOGPROBS;

/// Parses a number, or says that the text is not one.
fn number<T: FromStr>(s: &str) -> Result<T, String> {
    s.trim().parse::<T>().map_err(|_| format!("`{s}` is not a number"))
}

/// Parses a number of type `T` and keeps it if `ok` holds, else says `takes`.
fn checked<T: FromStr + Copy>(s: &str, ok: impl Fn(T) -> bool, takes: &str) -> Result<T, String> {
    let v = number::<T>(s)?;
    if ok(v) { Ok(v) } else { Err(takes.to_string()) }
}

/// `--temp`: finite, at least 0 (0: greedy).
/// A size in bytes: a number, or one with a `K`, `M` or `G` suffix (powers of 1024; `B`/`iB`
/// after it allowed): `8G`, `512MiB`, `1048576`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("`{s}` is not a size (bytes, or a number with K, M or G: 8G)"))?;
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}`: a size of at least one byte"));
    }
    Ok(bytes as u64)
}

pub fn temperature(s: &str) -> Result<f32, String> {
    checked(s, |t: f32| t.is_finite() && t >= 0.0, "the temperature takes a finite number of at least 0 (0: greedy)")
}

/// `--top-p`: above 0 and at most 1.
pub fn top_p(s: &str) -> Result<f32, String> {
    checked(s, |p: f32| p > 0.0 && p <= 1.0, "top-p takes a number above 0 and at most 1 (1: off)")
}

/// `--min-p`: from 0 to 1.
pub fn min_p(s: &str) -> Result<f32, String> {
    checked(s, |p: f32| (0.0..=1.0).contains(&p), "min-p takes a number from 0 to 1 (0: off)")
}

/// `--draft-p-min`: from 0 to 1.
pub fn draft_p_min(s: &str) -> Result<f32, String> {
    checked(s, |p: f32| (0.0..=1.0).contains(&p), "draft-p-min takes a probability from 0 to 1 (0: off)")
}

/// `--repeat-penalty`: finite, above 0.
pub fn repeat_penalty(s: &str) -> Result<f32, String> {
    checked(s, |x: f32| x.is_finite() && x > 0.0, "the repeat penalty takes a finite number above 0 (1: off)")
}

/// `--presence-penalty`, `--frequency-penalty`: finite, of either sign.
pub fn penalty(s: &str) -> Result<f32, String> {
    checked(s, |x: f32| x.is_finite(), "the penalty takes a finite number (0: off)")
}

/// `-n`: -1 (no limit) or a number of tokens.
pub fn n_predict(s: &str) -> Result<i64, String> {
    checked(s, |n: i64| n >= -1, "-n takes a number of tokens of at least 0, or -1 (until an end-of-generation token or a full context)")
}

/// `-s`: -1 (a random seed) or a seed from 0.
pub fn seed(s: &str) -> Result<i64, String> {
    checked(s, |n: i64| n >= -1, "the seed takes a number from 0 to 9223372036854775807, or -1 (a random seed)")
}

/// `--top-logprobs`: at most [`MAX_TOP_LOGPROBS`].
pub fn top_logprobs(s: &str) -> Result<usize, String> {
    let n = number::<i64>(s)?;
    match usize::try_from(n) {
        Ok(n) if n <= MAX_TOP_LOGPROBS => Ok(n),
        _ => Err(format!("--top-logprobs takes a number from 0 to {MAX_TOP_LOGPROBS}")),
    }
}

/// The most CPU threads `-t` takes: 4 per core this machine has.
pub fn max_threads() -> usize {
    4 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `-t`: from 1 to [`max_threads`].
pub fn threads(s: &str) -> Result<usize, String> {
    let n = number::<i64>(s)?;
    let cores = max_threads() / 4;
    match usize::try_from(n) {
        Ok(n) if (1..=max_threads()).contains(&n) => Ok(n),
        _ => Err(format!("-t takes 1 to {} threads (4 per core; this machine has {cores})", max_threads())),
    }
}

/// `-b`: at least 1.
pub fn batch_size(s: &str) -> Result<usize, String> {
    let n = number::<i64>(s)?;
    match usize::try_from(n) {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("the batch size takes a number of tokens of at least 1".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_of_each_range() {
        assert_eq!(temperature("0"), Ok(0.0));
        for bad in ["-1", "nan", "inf", "-0.5", "x"] {
            assert!(temperature(bad).is_err(), "{bad}");
        }
        assert_eq!(top_p("1"), Ok(1.0));
        assert!(top_p("0").is_err() && top_p("1.01").is_err() && top_p("NaN").is_err());
        assert_eq!((min_p("0"), min_p("1")), (Ok(0.0), Ok(1.0)));
        assert!(min_p("-0.01").is_err() && min_p("nan").is_err());
        assert!(repeat_penalty("0").is_err() && repeat_penalty("0.5").is_ok());
        assert!(penalty("-2").is_ok() && penalty("inf").is_err());
        assert_eq!((n_predict("-1"), seed("-1")), (Ok(-1), Ok(-1)));
        assert!(n_predict("-2").is_err() && seed("-2").is_err());
        assert_eq!(top_logprobs("100"), Ok(100));
        assert!(top_logprobs("101").is_err() && top_logprobs("-1").is_err());
        assert_eq!(threads(&max_threads().to_string()), Ok(max_threads()));
        assert!(threads("0").is_err() && threads(&(max_threads() + 1).to_string()).is_err());
        assert!(batch_size("0").is_err() && batch_size("1").is_ok());
        assert_eq!(
            (parse_bytes("8G"), parse_bytes("512MiB"), parse_bytes("1048576"), parse_bytes("1.5k")),
            (Ok(8 << 30), Ok(512 << 20), Ok(1 << 20), Ok(1536))
        );
        assert!(parse_bytes("0").is_err() && parse_bytes("x").is_err() && parse_bytes("-1G").is_err());
    }
}
