//! The `comms-analyzer` command line, built beside the ranks of the end-to-end hang tests
//! (`tests/hang.rs`), which run it on the dumps and live endpoints of real jobs.

fn main() -> std::process::ExitCode {
    comms_analyzer::cli::main()
}
