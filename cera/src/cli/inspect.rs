//! `cera inspect MODEL` (or `-m MODEL`): architecture, hyperparameters, tokenizer, chat template and a tensor
//! table, like gguf-dump.

use super::{CliError, Output, model_arg, open_model};
use crate::chat_template::TemplateSource;
use crate::gguf::{HyperParams, MetadataValue};
use crate::model_file::{ModelFile, TensorSource};

/// Arguments of `cera inspect`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model file or folder (or a test model name such as `smollm2-135m`).
    #[arg(value_name = "MODEL", required_unless_present = "model_flag", conflicts_with = "model_flag")]
    pub model: Option<String>,
    /// The model, as a flag (as `run`, `chat` and `bench` take it).
    #[arg(short = 'm', long = "model", id = "model_flag", value_name = "MODEL")]
    pub model_flag: Option<String>,
    /// Also print every metadata key (GGUF).
    #[arg(long)]
    pub metadata: bool,
    /// Print at most this many tensors (0: all).
    #[arg(long, default_value_t = 0)]
    pub max_tensors: usize,
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

fn print_hparams(hp: &HyperParams, out: &mut Output) -> Result<(), CliError> {
    writeln!(out, "architecture:        {}", hp.architecture)?;
    writeln!(out, "embedding_length:    {}", hp.embedding_length)?;
    writeln!(out, "block_count:         {}", hp.block_count)?;
    writeln!(out, "context_length:      {}", hp.context_length)?;
    writeln!(out, "head_count:          {}", hp.head_count)?;
    writeln!(out, "head_count_kv:       {}", hp.head_count_kv)?;
    writeln!(out, "key/value_length:    {}/{}", hp.key_length, hp.value_length)?;
    let optional = [
        ("feed_forward_length", hp.feed_forward_length.as_ref().map(|f| f.to_string())),
        ("rope.freq_base", hp.rope_freq_base.map(|v| v.to_string())),
        ("rope.dimension_count", hp.rope_dimension_count.map(|v| v.to_string())),
        ("rms_norm_eps", hp.rms_norm_eps.map(|v| v.to_string())),
        ("layer_norm_eps", hp.layer_norm_eps.map(|v| v.to_string())),
        ("sliding_window", hp.sliding_window.map(|v| v.to_string())),
        ("vocab_size", hp.vocab_size.map(|v| v.to_string())),
        ("expert_count", hp.expert_count.map(|v| v.to_string())),
        ("shortconv.l_cache", hp.shortconv_l_cache.map(|v| v.to_string())),
    ];
    for (name, v) in optional {
        if let Some(v) = v {
            writeln!(out, "{:<20} {v}", format!("{name}:"))?;
        }
    }
    Ok(())
}

/// Runs `cera inspect`.
pub fn run(args: Args, out: &mut Output) -> Result<(), CliError> {
    let (path, model) = open_model(&model_arg(args.model, args.model_flag)?)?;
    writeln!(out, "file:                {}", path.display())?;
    match &model {
        ModelFile::Gguf(g) => {
            writeln!(out, "format:              GGUF v{} ({} metadata keys, alignment {})", g.version(), g.metadata().len(), g.alignment())?;
            if let Ok(name) = g.metadata().get_str("general.name") {
                writeln!(out, "name:                {name}")?;
            }
        }
        ModelFile::Safetensors(s) => {
            writeln!(out, "format:              safetensors ({} shard(s))", s.shard_paths().count())?;
            if let Some(q) = s.config().and_then(|c| c.quantization.as_ref()) {
                writeln!(out, "quantization:        {:?} {} bits, group {:?}", q.method, q.bits, q.group_size)?;
            }
        }
    }
    match model.hparams() {
        Ok(hp) => print_hparams(&hp, out)?,
        Err(e) => writeln!(out, "hyperparameters:     unavailable ({e})")?,
    }
    match model.tokenizer() {
        Ok(tok) => {
            let pre = tok.pre_tokenizer().map(|p| format!(", pre-tokenizer `{p}`")).unwrap_or_default();
            writeln!(out, "tokenizer:           {}{pre}, {} tokens", tok.kind(), tok.vocab_size())?;
            let s = tok.special();
            let show = |id: Option<u32>| match id {
                Some(i) => format!("{i} {:?}", tok.token_text(i).unwrap_or_default()),
                None => "-".into(),
            };
            writeln!(out, "special tokens:      bos {}, eos {}, eot {}", show(s.bos), show(s.eos), show(s.eot))?;
            writeln!(out, "add bos/eos:         {}/{}", s.add_bos, s.add_eos)?;
            let tpl = if model.has_chat_template(&tok) {
                "present in file".to_string()
            } else {
                match model.chat_template(&tok) {
                    Ok(t) => match t.source() {
                        TemplateSource::Builtin(b) => {
                            format!("none in file (built-in `{}` used)", b.name())
                        }
                        _ => "none in file".to_string(),
                    },
                    Err(e) => format!("none ({e})"),
                }
            };
            writeln!(out, "chat template:       {tpl}")?;
        }
        Err(e) => writeln!(out, "tokenizer:           unavailable ({e})")?,
    }
    if args.metadata {
        if let ModelFile::Gguf(g) = &model {
            writeln!(out, "\nmetadata:")?;
            for (k, v) in g.metadata().iter() {
                let shown = match v {
                    MetadataValue::String(s) if s.len() > 80 => {
                        format!("<string of {} bytes>", s.len())
                    }
                    other => other.to_string(),
                };
                writeln!(out, "  {k:<45} {shown}")?;
            }
        }
    }
    let names = model.tensor_names();
    let total: u64 = names.iter().filter_map(|n| model.tensor_meta(n)).map(|m| m.n_bytes).sum();
    writeln!(out, "\ntensors: {} ({})", names.len(), human(total))?;
    writeln!(out, "  {:<5} {:<40} {:<8} {:<22} {:>10}", "#", "name", "type", "shape (ggml order)", "bytes")?;
    let limit = if args.max_tensors == 0 { names.len() } else { args.max_tensors };
    for (i, n) in names.iter().take(limit).enumerate() {
        if let Some(m) = model.tensor_meta(n) {
            let shape = format!("{:?}", m.dims);
            writeln!(out, "  {i:<5} {:<40} {:<8} {:<22} {:>10}", m.name, m.dtype.to_string(), shape, human(m.n_bytes))?;
        }
    }
    if limit < names.len() {
        writeln!(out, "  ... {} more", names.len() - limit)?;
    }
    Ok(())
}
