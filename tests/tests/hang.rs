//! Real jobs (4 ranks as processes over real transports) that hang, disagree or lag, and the
//! analyzer naming the culprit: from the dumps every rank writes (`report`), from the live
//! endpoints while the job still hangs (`watch`), and on the web page in a real headless
//! Chromium (`serve`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use torchcomms_core::bootstrap::tcp_store::TcpStoreServer;
use torchcomms_tests::{Job, RankOutput};

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_colltrace-worker"))
}

fn analyzer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_analyzer-cli"))
}

/// A fresh, empty directory for one test's dumps.
fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colltrace-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Where test artifacts (screenshots) are kept: `target/colltrace-artifacts`.
fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let d = target.join("colltrace-artifacts");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn show(outs: &[RankOutput]) -> String {
    outs.iter()
        .map(|o| {
            format!(
                "--- rank {} ({:?})\n{}\n{}",
                o.rank, o.status, o.stdout, o.stderr
            )
        })
        .collect()
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run comms-analyzer");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {:?}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `comms-analyzer report DIR` as JSON and as text.
fn report(dir: &Path) -> (Value, String) {
    let json = run_ok(analyzer().args(["report", "--format", "json"]).arg(dir));
    let text = run_ok(analyzer().arg("report").arg(dir));
    (
        serde_json::from_slice(&json.stdout).expect("verdict JSON"),
        String::from_utf8_lossy(&text.stdout).into_owned(),
    )
}

fn job(scenario: &[&str], dir: &Path, timeout_s: &str) -> Job {
    Job::new(4, scenario)
        .env("TORCHCOMMS_TRACE_DIR", dir.to_str().unwrap())
        .env("TORCHCOMM_TIMEOUT_SECONDS", timeout_s)
}

fn world(v: &Value) -> &Value {
    v["comms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "world")
        .unwrap_or_else(|| panic!("no comm `world` in {v:#}"))
}

/// The mismatch of `comm` whose odd ranks are `odd`, as (seq, fields, groups text).
fn mismatch_of(comm: &Value, odd: &[u64]) -> (u64, Vec<String>, String) {
    let m = comm["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["odd_ranks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap())
                .collect::<Vec<_>>()
                == odd
        })
        .unwrap_or_else(|| panic!("no mismatch naming {odd:?} in {comm:#}"));
    let fields = m["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    (m["seq"].as_u64().unwrap(), fields, m["groups"].to_string())
}

#[test]
fn a_skipped_all_reduce_is_named_from_the_dumps_of_every_rank() {
    let dir = fresh_dir("skip");
    let outs = job(
        &["skip", "--iters", "5", "--rank", "2", "--at", "2"],
        &dir,
        "3",
    )
    .run(&worker());
    assert_eq!(outs.len(), 4);
    for o in &outs {
        assert!(
            o.ok() && o.stdout.contains("RESULT error"),
            "{}",
            show(&outs)
        );
    }
    // Every rank dumped by itself (timeout, or the error its peers' abort caused).
    for r in 0..4 {
        let path = dir.join(format!("colltrace_rank{r}.json"));
        let text = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), show(&outs)));
        let dumps = colltrace::schema::parse_dumps(&text).unwrap();
        assert_eq!(dumps[0].rank, r);
        assert!(
            matches!(
                dumps[0].trigger,
                colltrace::Trigger::Timeout | colltrace::Trigger::Error
            ),
            "rank {r}: {:?}",
            dumps[0].trigger
        );
    }
    let (v, text) = report(&dir);
    let w = world(&v);
    let (seq, fields, groups) = mismatch_of(w, &[2]);
    assert_eq!(fields, ["op"]);
    assert!(
        groups.contains("all_reduce") && groups.contains("barrier"),
        "{groups}"
    );
    // Ranks 0, 1, 3 ran 5 all_reduces after the two barriers of creation; rank 2 ran 4, then
    // the barrier: they meet at seq 7.
    assert_eq!(seq, 7, "{text}");
    for needle in [
        "comm world".to_string(),
        format!("seq {seq}: rank 2 called barrier where ranks 0,1,3 called all_reduce"),
    ] {
        assert!(text.contains(&needle), "`{needle}` missing from:\n{text}");
    }
    assert_ne!(w["status"], "ok");
}

#[test]
fn ranks_passing_different_sizes_are_named() {
    let dir = fresh_dir("mismatch");
    let outs = job(
        &["mismatch", "--iters", "4", "--rank", "1", "--at", "1"],
        &dir,
        "3",
    )
    .run(&worker());
    for o in &outs {
        assert!(o.ok() && o.stdout.contains("DUMPED"), "{}", show(&outs));
    }
    let (v, text) = report(&dir);
    let (seq, fields, _) = mismatch_of(world(&v), &[1]);
    assert!(fields.contains(&"count".to_string()), "{fields:?}");
    assert_eq!(seq, 4);
    let needle = "seq 4: rank 1 called all_reduce (f32, 64 elements, 256 B, sum) where ranks 0,2,3 called all_reduce (f32, 2 elements, 8 B, sum)";
    assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
}

/// The verdict of the slow-rank job (rank 3 sleeps before each all_reduce): status ok and rank 3
/// the significantly slowest in all_reduce, by at least 100 ms on average.
fn assert_rank_3_is_the_slowest(v: &Value, text: &str) {
    let w = world(v);
    assert_eq!(w["status"], "ok", "{text}");
    let slow = w["slowest"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["op"] == "all_reduce")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(slow["rank"], 3, "{text}");
    assert_eq!(slow["significant"], true, "{text}");
    assert!(slow["mean_late_ms"].as_f64().unwrap() >= 100.0, "{text}");
    assert!(
        text.contains("rank 3 is the slowest in all_reduce"),
        "{text}"
    );
}

#[test]
fn one_slow_rank_is_named() {
    let dir = fresh_dir("slow");
    let outs = job(
        &["slow", "--iters", "5", "--rank", "3", "--delay-ms", "150"],
        &dir,
        "30",
    )
    .run(&worker());
    for o in &outs {
        assert!(o.ok() && o.stdout.contains("RESULT ok"), "{}", show(&outs));
    }
    let (v, text) = report(&dir);
    assert_rank_3_is_the_slowest(&v, &text);
}

#[test]
fn a_rank_that_never_joins_is_named() {
    let dir = fresh_dir("absent");
    // Rank 0 serves the store, so the absent rank is another one.
    let outs = job(&["absent", "--rank", "2"], &dir, "3").run(&worker());
    for o in &outs {
        assert!(o.ok() && o.stdout.contains("RESULT"), "{}", show(&outs));
    }
    let (v, text) = report(&dir);
    let w = world(&v);
    assert_eq!(w["no_dump"], serde_json::json!([2]), "{text}");
    assert_eq!(w["status"], "failed", "{text}");
    for needle in [
        "rank 2 never joined: no dump from it, and ranks 0,1,3 could not create the communicator without it",
        "ranks 0,1,3 failed: init seq 1",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}

fn find_chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .filter_map(|b| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(b))
                    .find(|f| f.is_file())
            })
        })
        .next()
}

fn chromium(bin: &Path, profile: &Path, args: &[&str], url: &str) -> Output {
    Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium")
}

/// Kills (by pid) and reaps the ranks this test started.
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A 4-rank job whose ranks serve their live state, with a store that outlives communicator
/// creation (torchrun-like), so the analyzer finds the endpoints there. The timeout is long:
/// everything the tests check happens before it fires.
struct LiveJob {
    ranks: Ranks,
    store: TcpStoreServer,
    store_addr: String,
}

fn live_job(scenario: &[&str], dir: &Path, env: &[(&str, &str)]) -> LiveJob {
    let store = TcpStoreServer::bind("127.0.0.1", 0).expect("store server");
    let port = store.port();
    let mut job = job(scenario, dir, "120")
        .env("TORCHCOMMS_TRACE_HTTP", "1")
        .env("TORCHELASTIC_USE_AGENT_STORE", "1");
    for (k, v) in env {
        job = job.env(k, v);
    }
    let mut ranks = Ranks(Vec::new());
    for r in 0..4 {
        let mut cmd = Command::new(worker());
        cmd.args(&job.args)
            .envs(job.rank_env(r, port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        ranks.0.push(cmd.spawn().expect("start a rank"));
    }
    LiveJob {
        ranks,
        store,
        store_addr: format!("127.0.0.1:{port}"),
    }
}

impl LiveJob {
    /// Polls `comms-analyzer watch --once` (JSON) until `named` holds for the verdict (at most
    /// 60 s), then returns it and the text verdict of a run right after.
    fn watch_until(&self, what: &str, named: impl Fn(&Value) -> bool) -> (Value, String) {
        let args = [
            "watch",
            "--once",
            "--hang-ms",
            "500",
            "--store",
            &self.store_addr,
        ];
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = analyzer()
                .args(args)
                .args(["--format", "json"])
                .output()
                .unwrap();
            assert!(
                out.status.code() == Some(0),
                "watch failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            if named(&v) {
                let text = run_ok(analyzer().args(args));
                return (v, String::from_utf8_lossy(&text.stdout).into_owned());
            }
            assert!(Instant::now() < deadline, "watch never named {what}: {v:#}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Every rank still runs and none dumped a file into `dir`: what watch said came from the
    /// live endpoints.
    fn assert_still_live(&mut self, dir: &Path) {
        for c in &mut self.ranks.0 {
            assert!(
                c.try_wait().unwrap().is_none(),
                "a rank exited before the timeout: the verdict must come from live state"
            );
        }
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
    }
}

/// The `world` comm of a verdict, if it has one.
fn world_of(v: &Value) -> Option<&Value> {
    v["comms"].as_array()?.iter().find(|c| c["name"] == "world")
}

#[test]
fn a_live_hang_is_named_by_watch_and_on_the_web_page() {
    let dir = fresh_dir("live");
    // Rank 2 sleeps before its third all_reduce; the others wait in it (the timeout is 120 s).
    let mut job = live_job(
        &[
            "stall",
            "--iters",
            "5",
            "--rank",
            "2",
            "--at",
            "2",
            "--delay-ms",
            "120000",
        ],
        &dir,
        &[],
    );
    let behind = "rank 2 is behind: it completed seq 4 and never called seq 5";
    let (v, text) = job.watch_until("the hang", |v| {
        world_of(v).is_some_and(|c| {
            c["progress"].as_array().is_some_and(|p| p.len() == 4)
                && c["findings"].to_string().contains(behind)
        })
    });
    job.assert_still_live(&dir);
    let w = world(&v);
    assert_eq!(w["behind"][0]["rank"], 2, "{w:#}");
    assert!(w["mismatches"].as_array().unwrap().is_empty(), "{w:#}");
    for r in [0, 1, 3] {
        let current = &w["progress"][r]["current"];
        assert_eq!(
            (&current["op"], &current["seq"], &current["state"]),
            (&json!("all_reduce"), &json!(5), &json!("started")),
            "rank {r}: {w:#}"
        );
    }
    assert!(text.contains(behind), "{text}");
    let LiveJob {
        mut ranks,
        store,
        store_addr,
    } = job;

    // serve + a real browser.
    let Some(browser) = find_chromium() else {
        if std::env::var("TORCHCOMMS_REQUIRE_BROWSER").as_deref() == Ok("1") {
            panic!(
                "TORCHCOMMS_REQUIRE_BROWSER=1 but no chromium in PATH (apt-get install chromium)"
            );
        }
        println!("SKIPPED: web page test (no chromium in PATH; apt-get install chromium)");
        return;
    };
    let mut serve = analyzer()
        .args([
            "serve",
            "--refresh-ms",
            "0",
            "--hang-ms",
            "500",
            "--listen",
            "127.0.0.1:0",
            "--store",
            &store_addr,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(serve.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let url = first
        .trim()
        .strip_prefix("serving on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    ranks.0.push(serve);
    let profile = fresh_dir("chromium-profile");
    let dom = chromium(&browser, &profile, &["--dump-dom"], &url);
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    for needle in [behind, "Timeline per rank", "class=\"lane\""] {
        assert!(
            dom_text.contains(needle),
            "`{needle}` not on the page:\n{dom_text}\n{}",
            String::from_utf8_lossy(&dom.stderr)
        );
    }
    let shot = artifacts().join("analyzer-hung-job.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(
        &browser,
        &profile,
        &[
            "--window-size=1280,1000",
            &format!("--screenshot={}", shot.display()),
        ],
        &url,
    );
    assert!(
        shot.metadata().is_ok_and(|m| m.len() > 1000),
        "no screenshot at {}: {}",
        shot.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("screenshot of the page: {}", shot.display());
    drop(ranks);
    let _ = store.shutdown();
}

#[test]
fn a_live_size_mismatch_is_named_by_watch() {
    let dir = fresh_dir("live-mismatch");
    // Rank 1 passes 64 elements to the second all_reduce, the others 2. The engine sees the
    // sizes differ on the wire and fails the operation on every rank; the ranks then stay up
    // (holding) long past the checks below. They dump only on a signal, so that no file can
    // stand in for the live state.
    let mut job = live_job(
        &[
            "mismatch",
            "--iters",
            "4",
            "--rank",
            "1",
            "--at",
            "1",
            "--hold-ms",
            "120000",
        ],
        &dir,
        &[("TORCHCOMMS_TRACE_DUMP_ON", "signal")],
    );
    let (v, text) = job.watch_until("the size mismatch", |v| {
        world_of(v).is_some_and(|c| {
            c["progress"].as_array().is_some_and(|p| p.len() == 4)
                && c["mismatches"].as_array().is_some_and(|ms| {
                    ms.iter()
                        .any(|m| m["odd_ranks"] == serde_json::json!([1]) && m["seq"] == 4)
                })
        })
    });
    job.assert_still_live(&dir);
    let (seq, fields, _) = mismatch_of(world(&v), &[1]);
    assert_eq!(seq, 4);
    assert!(fields.contains(&"count".to_string()), "{fields:?}");
    assert_ne!(world(&v)["status"], "ok", "{text}");
    let needle = "seq 4: rank 1 called all_reduce (f32, 64 elements, 256 B, sum) where ranks 0,2,3 called all_reduce (f32, 2 elements, 8 B, sum)";
    assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    let _ = job.store.shutdown();
}

#[test]
fn a_live_slow_rank_is_named_by_watch() {
    let dir = fresh_dir("live-slow");
    // Rank 3 sleeps 150 ms before each of 8 all_reduces; then every rank holds, alive.
    let iters = 8;
    let mut job = live_job(
        &[
            "slow",
            "--iters",
            &iters.to_string(),
            "--rank",
            "3",
            "--delay-ms",
            "150",
            "--hold-ms",
            "120000",
        ],
        &dir,
        &[],
    );
    // Two barriers of creation, the all_reduces, the final barrier.
    let last = iters + 3;
    let (v, text) = job.watch_until("the slow rank after every rank finished", |v| {
        world_of(v).is_some_and(|c| {
            c["progress"]
                .as_array()
                .is_some_and(|p| p.len() == 4 && p.iter().all(|r| r["completed"] == last))
        })
    });
    job.assert_still_live(&dir);
    assert_rank_3_is_the_slowest(&v, &text);
    let _ = job.store.shutdown();
}

#[test]
fn corrupt_truncated_and_foreign_dumps_are_clear_errors() {
    let dir = fresh_dir("corrupt");
    // A good dump from this process.
    let meta = colltrace::CommMeta {
        name: "solo".into(),
        instance: 1,
        rank: 0,
        size: 1,
        global_ranks: vec![0],
    };
    let t = colltrace::CommTrace::new(meta, 10);
    let mut w = t.writer();
    let mut h = t.submit(false, 1, "all_reduce", Some(true), Duration::from_secs(9));
    let info = colltrace::OpInfo::default;
    w.start(&mut h, info, Some("socket"), Some("direct"));
    w.finish(&mut h, colltrace::Outcome::Completed);
    let good = colltrace::dump_all(&dir).unwrap();
    assert_eq!(good.len(), 1);
    let text = std::fs::read_to_string(&good[0]).unwrap();
    std::fs::write(dir.join("truncated.json"), &text[..text.len() / 3]).unwrap();
    std::fs::write(dir.join("garbage.json"), b"\x7fELF\x00\x01 not json").unwrap();
    let other = text.replacen("\"version\": 1", "\"version\": 99", 1);
    assert_ne!(other, text);
    std::fs::write(dir.join("future.json"), other).unwrap();
    std::fs::write(
        dir.join("fr.json"),
        br#"{"version":"2.10","pg_config":{},"pg_status":{}}"#,
    )
    .unwrap();

    let out = analyzer().arg("report").arg(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{err}");
    for needle in [
        "truncated.json",
        "truncated or corrupt",
        "garbage.json",
        "future.json",
        "schema version 99; this build reads version 1",
        "fr.json",
        "expected \"schema\": \"torchcomms-colltrace\"",
    ] {
        assert!(
            err.contains(needle),
            "`{needle}` missing from stderr:\n{err}"
        );
    }
    assert!(stdout.contains("comm solo"), "{stdout}");

    // Nothing readable: an error exit, no panic.
    let only_bad = fresh_dir("only-bad");
    std::fs::copy(dir.join("future.json"), only_bad.join("future.json")).unwrap();
    let out = analyzer().arg("report").arg(&only_bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no readable colltrace dump") && err.contains("version 99"),
        "{err}"
    );
    let out = analyzer()
        .args(["report", "/nonexistent/dir"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read directory"));
}

#[test]
fn an_invalid_cvar_fails_comm_creation_naming_it() {
    let outs = Job::new(1, &["slow", "--iters", "1"])
        .env("CTRAN_CHUNK_BYTES", "lots")
        .run(&worker());
    let o = &outs[0];
    assert_eq!(o.status.and_then(|s| s.code()), Some(1), "{}", show(&outs));
    for needle in ["CTRAN_CHUNK_BYTES", "lots", ">= 4096", "environment"] {
        assert!(
            o.stderr.contains(needle),
            "`{needle}` missing: {}",
            o.stderr
        );
    }
}
