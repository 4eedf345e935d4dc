//! `tickmark`: the operator's command line. Everything is in `tickmark::cli`;
//! `tickmark --help` lists the commands, `docs/operations.md` is the guide.

fn main() -> std::process::ExitCode {
    tickmark::cli::main()
}
