//! `cera template MODEL --system S --user U` (or `-m MODEL`): render a conversation with the chat template.

use clap::ArgMatches;

use super::{CliError, Output, model_arg, open_model};
use crate::chat_template::ChatMessage;

/// Arguments of `cera template`.
///
/// The messages are `--system`, `--user` and `--assistant`, each as often as wanted; they form
/// the conversation in the order they are given on the command line.
#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("messages").args(ROLES).multiple(true).required(true))]
#[command(after_help = "Each of --system, --user and --assistant may be given any number of times; the messages keep their command-line order.")]
pub struct Args {
    /// Model file or folder (or a test model name such as `smollm2-135m`).
    #[arg(value_name = "MODEL", required_unless_present = "model_flag", conflicts_with = "model_flag")]
    pub model: Option<String>,
    /// The model, as a flag (as `run`, `chat` and `bench` take it).
    #[arg(short = 'm', long = "model", id = "model_flag", value_name = "MODEL")]
    pub model_flag: Option<String>,
    /// A system message.
    #[arg(long, value_name = "TEXT")]
    pub system: Vec<String>,
    /// A user message.
    #[arg(long, value_name = "TEXT")]
    pub user: Vec<String>,
    /// An assistant message.
    #[arg(long, value_name = "TEXT")]
    pub assistant: Vec<String>,
    /// Leave out the opening of the assistant's turn at the end.
    #[arg(long)]
    pub no_generation_prompt: bool,
}

/// The message options; each one's id is also the message's role.
const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// The messages in command-line order. `matches` are the subcommand's: only they know where each
/// occurrence of `--user`, `--assistant` and `--system` stood.
fn messages(matches: &ArgMatches) -> Vec<ChatMessage> {
    let mut placed: Vec<(usize, &str, &String)> = Vec::new();
    for role in ROLES {
        let (Some(indices), Some(values)) = (matches.indices_of(role), matches.get_many::<String>(role)) else { continue };
        placed.extend(indices.zip(values).map(|(i, v)| (i, role, v)));
    }
    placed.sort_by_key(|&(i, _, _)| i);
    placed.into_iter().map(|(_, role, text)| ChatMessage::new(role, text.clone())).collect()
}

/// Runs `cera template`.
pub fn run(args: Args, matches: &ArgMatches, out: &mut Output) -> Result<(), CliError> {
    let (path, model) = open_model(&model_arg(args.model, args.model_flag)?)?;
    let tok = model.tokenizer().map_err(|e| CliError::in_file(&path, e))?;
    let tpl = model.chat_template(&tok).map_err(|e| CliError::in_file(&path, e))?;
    let msgs = messages(matches);
    let text = tpl.render(&msgs, !args.no_generation_prompt).map_err(|e| CliError::in_file(&path, e))?;
    out.write_str(&text)
}
