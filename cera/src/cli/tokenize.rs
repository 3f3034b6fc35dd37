//! `cera tokenize MODEL TEXT` (or `-m MODEL TEXT`): print token ids and pieces.

use super::{CliError, Output, open_model};
use crate::tokenizer::EncodeOptions;

/// Arguments of `cera tokenize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model file or folder (or a test model name such as `smollm2-135m`); with `-m MODEL`, the
    /// first argument is the text.
    #[arg(value_name = "MODEL")]
    pub model: Option<String>,
    /// The text to tokenize.
    #[arg(value_name = "TEXT")]
    pub text: Option<String>,
    /// The model, as a flag (as `run`, `chat` and `bench` take it).
    #[arg(short = 'm', long = "model", id = "model_flag", value_name = "MODEL")]
    pub model_flag: Option<String>,
    /// Read the text from a file instead (`-` for standard input).
    #[arg(long, short = 'f')]
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
    // With `-m`, the one argument is the text.
    let (model_name, text) = match (args.model_flag, args.model, args.text) {
        (Some(_), Some(_), Some(_)) => return Err(CliError::Message("with -m MODEL, give only the text as an argument".into())),
        (Some(m), text, None) => (m, text),
        (None, Some(m), text) => (m, text),
        (Some(_), None, Some(_)) | (None, None, _) => return Err(CliError::Message("give the model: cera tokenize MODEL TEXT, or -m MODEL TEXT".into())),
    };
    let (path, model) = open_model(&model_name)?;
    let tok = model.tokenizer().map_err(|e| CliError::in_file(&path, e))?;
    let opts = EncodeOptions { add_special: !args.no_special, parse_special: !args.no_parse_special };
    let text = match (&text, &args.file) {
        (Some(_), Some(_)) => return Err(CliError::Message("give the text or --file, not both".into())),
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
