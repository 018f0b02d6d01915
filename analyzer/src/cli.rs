//! The `comms-analyzer` command line: names the rank that hangs, and why. See
//! `comms-analyzer --help`. [`main`] is the whole program, so other binaries (the end-to-end
//! tests' copy) run the same one.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::{analyze, render, Options, Source, Verdict};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Reads the colltrace dumps (or live endpoints) of all ranks and gives a verdict: ranks behind
/// and the op they are stuck in, ops that differ across ranks, ranks that never joined, the
/// slowest rank per op, and a timeline per rank.
#[derive(Debug, Parser)]
#[command(name = "comms-analyzer", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Analyze the dump files in DIR (TORCHCOMMS_TRACE_DIR of the job).
    Report {
        /// Directory of `colltrace_rank*.json` files.
        dir: PathBuf,
        #[command(flatten)]
        out: Output,
    },
    /// Poll the live endpoints of running ranks and print the verdict each time.
    Watch {
        #[command(flatten)]
        live: Live,
        #[command(flatten)]
        out: Output,
        /// Seconds between polls.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Poll once, print, and exit.
        #[arg(long)]
        once: bool,
    },
    /// Serve the verdict as a web page (`/`) and JSON (`/api/verdict`, `/api/dumps`).
    Serve {
        #[command(flatten)]
        live: Live,
        /// Serve the dumps in this directory instead of live endpoints.
        #[arg(long, conflicts_with_all = ["store", "endpoints"])]
        dir: Option<PathBuf>,
        /// Address to listen on (port 0: any free port; printed on the first line).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// How often the page refreshes itself, in milliseconds (0: never).
        #[arg(long, default_value_t = 2000)]
        refresh_ms: u64,
        /// Operations running longer than this count as hung.
        #[arg(long, default_value_t = Options::default().hang_ms)]
        hang_ms: u64,
    },
}

#[derive(Debug, Args)]
struct Live {
    /// TCPStore (`host:port`, e.g. MASTER_ADDR:MASTER_PORT under torchrun) where ranks published
    /// their endpoints.
    #[arg(long)]
    store: Option<String>,
    /// Endpoints (`host:port`), comma-separated.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Seconds to wait for each endpoint or the store.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
}

#[derive(Debug, Args)]
struct Output {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Operations running longer than this (at dump time) count as hung.
    #[arg(long, default_value_t = Options::default().hang_ms)]
    hang_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
    Html,
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| {
            format!("invalid value for '--{what}': expected a positive number of seconds")
        })
}

impl Live {
    fn source(&self) -> Result<Source> {
        match (&self.store, self.endpoints.is_empty()) {
            (Some(s), true) => Ok(Source::Store(s.clone())),
            (None, false) => Ok(Source::Endpoints(self.endpoints.clone())),
            (Some(_), false) => bail!("give --store or --endpoints, not both"),
            (None, true) => bail!("give --store HOST:PORT or --endpoints HOST:PORT,..."),
        }
    }
}

fn print(v: &Verdict, f: Format) -> Result<()> {
    let s = match f {
        Format::Text => render::text(v),
        Format::Json => serde_json::to_string_pretty(v)? + "\n",
        Format::Html => render::html(v, 0),
    };
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) ends the output quietly.
    let _ = out.write_all(s.as_bytes()).and_then(|_| out.flush());
    Ok(())
}

fn report(dir: PathBuf, out: Output) -> Result<ExitCode> {
    let (dumps, problems) = Source::Dir(dir.clone()).collect(Duration::from_secs(1))?;
    if dumps.is_empty() {
        for p in &problems {
            eprintln!("comms-analyzer: {}: {}", p.source, p.reason);
        }
        bail!("no readable colltrace dump in {}", dir.display());
    }
    for p in &problems {
        eprintln!("comms-analyzer: skipping {}: {}", p.source, p.reason);
    }
    let opts = Options {
        hang_ms: out.hang_ms,
        ..Options::default()
    };
    print(&analyze(&dumps, problems, &opts), out.format)?;
    Ok(ExitCode::SUCCESS)
}

fn watch(live: Live, out: Output, interval: f64, once: bool) -> Result<ExitCode> {
    let source = live.source()?;
    let timeout = secs(live.timeout, "timeout")?;
    let interval = secs(interval, "interval")?;
    let opts = Options {
        hang_ms: out.hang_ms,
        ..Options::default()
    };
    loop {
        let (dumps, problems) = source.collect(timeout)?;
        let v = analyze(&dumps, problems, &opts);
        if !once {
            println!("--- {} ---", colltrace::now_ns() / 1_000_000);
        }
        print(&v, out.format)?;
        if once {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(interval);
    }
}

fn serve(
    live: Live,
    dir: Option<PathBuf>,
    listen: String,
    refresh_ms: u64,
    hang_ms: u64,
) -> Result<ExitCode> {
    let source = match dir {
        Some(d) => Source::Dir(d),
        None => live.source()?,
    };
    let timeout = secs(live.timeout, "timeout")?;
    let opts = Options {
        hang_ms,
        ..Options::default()
    };
    let server = tiny_http::Server::http(listen.as_str())
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let addr = server.server_addr().to_ip().context("not an IP listener")?;
    println!("serving on http://{addr}/");
    let _ = std::io::stdout().flush();
    let header = |v: &str| {
        tiny_http::Header::from_bytes(&b"Content-Type"[..], v.as_bytes()).expect("static header")
    };
    for req in server.incoming_requests() {
        let path = req.url().split('?').next().unwrap_or("/").to_string();
        let (body, ctype, code) = match source.collect(timeout) {
            Err(e) => (
                serde_json::json!({ "error": e.to_string() }).to_string(),
                "application/json",
                500,
            ),
            Ok((dumps, problems)) => match path.as_str() {
                "/" | "/index.html" => (
                    render::html(&analyze(&dumps, problems, &opts), refresh_ms),
                    "text/html; charset=utf-8",
                    200,
                ),
                "/api/verdict" => (
                    serde_json::to_string(&analyze(&dumps, problems, &opts))?,
                    "application/json",
                    200,
                ),
                "/api/dumps" => (serde_json::to_string(&dumps)?, "application/json", 200),
                _ => (
                    serde_json::json!({ "error": "not found: /, /api/verdict, /api/dumps" })
                        .to_string(),
                    "application/json",
                    404,
                ),
            },
        };
        let resp = tiny_http::Response::from_string(body)
            .with_status_code(code)
            .with_header(header(ctype));
        let _ = req.respond(resp);
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the command line of this process's arguments.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Report { dir, out } => report(dir, out),
        Cmd::Watch {
            live,
            out,
            interval,
            once,
        } => watch(live, out, interval, once),
        Cmd::Serve {
            live,
            dir,
            listen,
            refresh_ms,
            hang_ms,
        } => serve(live, dir, listen, refresh_ms, hang_ms),
    };
    match r {
        Ok(c) => c,
        Err(e) => {
            eprintln!("comms-analyzer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
