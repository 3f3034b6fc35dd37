//! llama.cpp's multi-letter flags (`-ngl 99`, `-sys TEXT`, `-fa on`, `-cnv`, `-hf REPO`) and
//! their long forms, rewritten before clap reads the command line: clap would read `-ngl` as
//! `-n gl` and `-fa` as `-f a` (run's prompt file `a`).
//!
//! What each becomes ([`FLAGS`]): `-sys` is cera's `--system`; `-ngl` and `-fa` are accepted and
//! do nothing, with a note on standard error (every layer runs on the GPU, or on the CPU with
//! `--device cpu`; attention is always one fused kernel); `-no-cnv` is what `cera run` does
//! anyway; `-cnv` and `-hf` are errors that say what to do instead. `-f FILE` (with a space) is
//! still run's prompt file. A token that is the value of an option taking text (`-p -fa`) is
//! left alone.

use std::ffi::OsString;

/// What a llama.cpp flag becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// Another flag of cera's, with the value that follows.
    Rename(&'static str),
    /// Nothing, with a note; `value`: whether it takes the token after it.
    Ignore { value: Value, note: &'static str },
    /// An error.
    Refuse(&'static str),
}

/// Whether an ignored flag takes the token after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    /// No value.
    None,
    /// Always the next token.
    Required,
    /// The next token if it is one of these.
    OneOf(&'static [&'static str]),
}

const NGL_NOTE: &str = "cera runs every layer on the GPU (--device cpu: every layer on the CPU)";
const FA_NOTE: &str = "cera's attention is always one fused kernel";
const CNV_ERROR: &str = "cera runs a conversation with `cera chat` (cera chat -m MODEL); `cera run` answers one prompt";
const HF_ERROR: &str = "cera does not download from the Hugging Face hub: download the GGUF file and pass -m FILE (or `cera fetch NAME` for a test model)";

/// llama.cpp's flags that clap would misread or that cera spells differently.
const FLAGS: &[(&str, Action)] = &[
    ("-ngl", Action::Ignore { value: Value::Required, note: NGL_NOTE }),
    ("--n-gpu-layers", Action::Ignore { value: Value::Required, note: NGL_NOTE }),
    ("--gpu-layers", Action::Ignore { value: Value::Required, note: NGL_NOTE }),
    ("-fa", Action::Ignore { value: Value::OneOf(&["on", "off", "auto"]), note: FA_NOTE }),
    ("--flash-attn", Action::Ignore { value: Value::OneOf(&["on", "off", "auto"]), note: FA_NOTE }),
    ("-no-cnv", Action::Ignore { value: Value::None, note: "`cera run` answers one prompt (`cera chat` converses)" }),
    ("--no-conversation", Action::Ignore { value: Value::None, note: "`cera run` answers one prompt (`cera chat` converses)" }),
    ("-sys", Action::Rename("--system")),
    ("--system-prompt", Action::Rename("--system")),
    ("-cnv", Action::Refuse(CNV_ERROR)),
    ("--conversation", Action::Refuse(CNV_ERROR)),
    ("-hf", Action::Refuse(HF_ERROR)),
    ("-hfr", Action::Refuse(HF_ERROR)),
    ("--hf-repo", Action::Refuse(HF_ERROR)),
];

/// cera's options whose value is free text: the token after them is never a flag.
const TEXT_OPTIONS: &[&str] = &["-p", "--prompt", "--system", "--user", "--assistant", "--stop"];

/// The command line with llama.cpp's flags rewritten (the program name first, as given), and
/// the notes to print; or the error for a refused flag.
pub fn rewrite(args: impl IntoIterator<Item = OsString>) -> Result<(Vec<OsString>, Vec<String>), String> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let mut it = args.into_iter().peekable();
    if let Some(program) = it.next() {
        out.push(program);
    }
    while let Some(arg) = it.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(it);
            break;
        }
        // `--flag=VALUE` as well as `--flag VALUE`.
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (text, None),
        };
        let Some(&(flag, action)) = FLAGS.iter().find(|(f, _)| *f == name) else {
            let takes_text = TEXT_OPTIONS.contains(&text);
            out.push(arg);
            if takes_text {
                out.extend(it.next());
            }
            continue;
        };
        match action {
            // Renamed options take text (`-sys TEXT`): the value is never a flag.
            Action::Rename(to) => match inline {
                Some(v) => out.push(format!("{to}={v}").into()),
                None => {
                    out.push(to.into());
                    out.extend(it.next());
                }
            },
            Action::Ignore { value, note } => {
                let given = match (value, inline) {
                    (_, Some(v)) => Some(v),
                    (Value::None, None) => None,
                    (Value::Required, None) => {
                        let v = it.next().ok_or_else(|| format!("{flag} takes a value (llama.cpp's flag; {note})"))?;
                        Some(v.to_string_lossy().into_owned())
                    }
                    (Value::OneOf(list), None) => {
                        let next = it.peek().and_then(|v| v.to_str()).filter(|v| list.contains(v)).map(str::to_string);
                        if next.is_some() {
                            it.next();
                        }
                        next
                    }
                };
                let shown = given.map_or_else(|| flag.to_string(), |v| format!("{flag} {v}"));
                notes.push(format!("note: {shown} is llama.cpp's and does nothing here: {note}"));
            }
            Action::Refuse(why) => return Err(format!("{flag}: {why}")),
        }
    }
    Ok((out, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<OsString> {
        line.split(' ').map(OsString::from).collect()
    }

    fn rewritten(line: &str) -> (String, usize) {
        let (args, notes) = rewrite(words(line)).unwrap();
        (args.iter().map(|a| a.to_str().unwrap()).collect::<Vec<_>>().join(" "), notes.len())
    }

    #[test]
    fn flags_are_rewritten_and_values_left_alone() {
        assert_eq!(rewritten("cera run -ngl 99 -n 8 hi"), ("cera run -n 8 hi".into(), 1));
        assert_eq!(rewritten("cera run --n-gpu-layers=99 hi"), ("cera run hi".into(), 1));
        assert_eq!(rewritten("cera run -fa on -f a.txt"), ("cera run -f a.txt".into(), 1));
        assert_eq!(rewritten("cera run -fa -f a.txt"), ("cera run -f a.txt".into(), 1));
        assert_eq!(rewritten("cera run -sys S hi"), ("cera run --system S hi".into(), 0));
        assert_eq!(rewritten("cera run --system-prompt -ngl hi"), ("cera run --system -ngl hi".into(), 0));
        assert_eq!(rewritten("cera run -p -fa -no-cnv"), ("cera run -p -fa".into(), 1));
        assert_eq!(rewritten("cera run -- -ngl"), ("cera run -- -ngl".into(), 0));
        assert!(rewrite(words("cera run -cnv")).unwrap_err().contains("cera chat"));
        assert!(rewrite(words("cera run --hf-repo=a/b")).unwrap_err().contains("-m FILE"));
        assert!(rewrite(words("cera run -ngl")).unwrap_err().contains("takes a value"));
    }
}
