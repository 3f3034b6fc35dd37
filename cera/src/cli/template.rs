//! `cera template MODEL --system S --user U`: render a conversation with the chat template.

use super::{CliError, resolve_model};
use crate::chat_template::ChatMessage;
use crate::model_file::ModelFile;

/// Arguments of `cera template`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model file or folder (or a test model name such as `smollm2-135m`).
    pub model: String,
    /// A system prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// User messages; with `--assistant`, turns alternate user, assistant, user, ...
    #[arg(long, required = true)]
    pub user: Vec<String>,
    /// Assistant replies between the user messages.
    #[arg(long)]
    pub assistant: Vec<String>,
    /// Leave out the opening of the assistant's turn at the end.
    #[arg(long)]
    pub no_generation_prompt: bool,
}

/// Runs `cera template`.
pub fn run(args: Args) -> Result<(), CliError> {
    let model = ModelFile::open(resolve_model(&args.model)?).map_err(CliError::from_err)?;
    let tok = model.tokenizer().map_err(CliError::from_err)?;
    let tpl = model.chat_template(&tok).map_err(CliError::from_err)?;
    let mut msgs = Vec::new();
    if let Some(s) = args.system {
        msgs.push(ChatMessage::new("system", s));
    }
    let mut assistant = args.assistant.into_iter();
    for u in args.user {
        msgs.push(ChatMessage::new("user", u));
        if let Some(a) = assistant.next() {
            msgs.push(ChatMessage::new("assistant", a));
        }
    }
    let text = tpl.render(&msgs, !args.no_generation_prompt).map_err(CliError::from_err)?;
    print!("{text}");
    Ok(())
}
