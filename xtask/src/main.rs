//! `cargo xtask <command>`: developer tasks.
//!
//! - `bench [--quick]`: the benchmark table (roofline, copy, matmul) on the chosen GPU
//!   (`NUMR_ADAPTER` picks it), printed as markdown for the README.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "Developer tasks for the workspace")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the benchmark table: streaming-read roofline, copy and matmul.
    Bench {
        /// Small sizes and few repetitions (for software adapters).
        #[arg(long)]
        quick: bool,
    },
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match Cli::parse().cmd {
        Cmd::Bench { quick } => {
            let ctx = numr::GpuContext::new()?;
            let rows = benches::core_table(&ctx, quick)?;
            benches::print_table(&ctx, &rows);
        }
    }
    Ok(())
}
