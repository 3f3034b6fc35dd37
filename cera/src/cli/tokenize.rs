//! `cera tokenize MODEL TEXT`: print token ids and pieces.

use super::{CliError, Output, open_model};
use crate::tokenizer::EncodeOptions;

/// Arguments of `cera tokenize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model file or folder (or a test model name such as `smollm2-135m`).
    pub model: String,
    /// The text to tokenize.
    #[arg(required_unless_present = "file")]
    pub text: Option<String>,
    /// Read the text from a file instead (`-` for standard input).
    #[arg(long, short = 'f', conflicts_with = "text")]
    pub file: Option<std::path::PathBuf>,
    /// Do not add BOS/EOS.
    #[arg(long)]
    pub no_special: bool,
    /// Treat control tokens written in the text (`<|im_start|>`) as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print only the ids, space-separated.
    #[arg(long)]
    pub ids_only: bool,
}

/// Runs `cera tokenize`.
pub fn run(args: Args, out: &mut Output) -> Result<(), CliError> {
    let (path, model) = open_model(&args.model)?;
    let tok = model.tokenizer().map_err(|e| CliError::in_file(&path, e))?;
    let opts = EncodeOptions { add_special: !args.no_special, parse_special: !args.no_parse_special };
    let text = match (&args.text, &args.file) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| CliError::Message(format!("standard input: {e}")))?;
            s
        }
        (None, Some(p)) => std::fs::read_to_string(p).map_err(|e| CliError::in_file(p, e))?,
        (None, None) => return Err(CliError::Message("give the text or --file".into())),
    };
    let ids = tok.encode(&text, opts).map_err(CliError::from_err)?;
    if args.ids_only {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        return writeln!(out, "{}", s.join(" "));
    }
    writeln!(out, "{} tokens", ids.len())?;
    for id in ids {
        let piece = tok.piece(id, true).map_err(CliError::from_err)?;
        let shown = match std::str::from_utf8(&piece) {
            Ok(s) => format!("{s:?}"),
            Err(_) => format!("{piece:02x?} (partial UTF-8)"),
        };
        writeln!(out, "{id:>8}  {shown}")?;
    }
    Ok(())
}
