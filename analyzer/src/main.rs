//! `comms-analyzer`: names the rank that hangs, and why. See `comms-analyzer --help`.

fn main() -> std::process::ExitCode {
    comms_analyzer::cli::main()
}
