//! The `cera` command line. See `cera --help`.

fn main() -> std::process::ExitCode {
    cera::cli::main()
}
