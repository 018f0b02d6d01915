//! The verdict as text and as a web page.

use std::fmt::Write as _;

use crate::verdict::{CommVerdict, Verdict};

/// Operations of each rank shown in the text timeline.
const TEXT_TIMELINE: usize = 8;

/// The verdict for a terminal.
pub fn text(v: &Verdict) -> String {
    let mut s = String::from("VERDICT\n");
    for line in &v.summary {
        let _ = writeln!(s, "  * {line}");
    }
    let _ = writeln!(s, "\nRANKS ({} dumped)", v.ranks.len());
    for r in &v.ranks {
        let _ = writeln!(
            s,
            "  rank {} on {} (pid {}): {}{}",
            r.rank,
            r.host,
            r.pid,
            r.trigger,
            r.reason
                .as_deref()
                .map(|x| format!(": {}", one_line(x)))
                .unwrap_or_default()
        );
    }
    for c in &v.comms {
        comm_text(&mut s, c);
    }
    s
}

fn one_line(s: &str) -> String {
    let l: String = s.replace('\n', " ");
    if l.chars().count() > 160 {
        format!("{}...", l.chars().take(157).collect::<String>())
    } else {
        l
    }
}

fn comm_text(s: &mut String, c: &CommVerdict) {
    let ranks: Vec<String> = c.global_ranks.iter().map(|r| r.to_string()).collect();
    let _ = writeln!(
        s,
        "\n== comm {} (instance {}, {} ranks: global {}): {}",
        c.name,
        c.instance,
        c.size,
        ranks.join(","),
        c.status.to_uppercase()
    );
    for f in &c.findings {
        let _ = writeln!(s, "   ! {f}");
    }
    let _ = writeln!(
        s,
        "   collectives: completed by all ranks: seq {}; started by all: seq {}; started by any: seq {}",
        c.completed_by_all, c.started_by_all, c.started_by_any
    );
    let _ = writeln!(
        s,
        "   {:>5} {:>10} {:>8} {:>10} {:>8} {:>9}  current",
        "rank", "state", "started", "completed", "p2p-st", "p2p-done"
    );
    for p in &c.progress {
        let cur = p
            .current
            .as_ref()
            .map(|o| {
                format!(
                    "{} seq {} {}{}",
                    o.op,
                    o.seq,
                    o.state,
                    o.running_ms
                        .map(|ms| format!(" for {ms:.0} ms"))
                        .unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "   {:>5} {:>10} {:>8} {:>10} {:>8} {:>9}  {cur}",
            p.rank, p.state, p.started, p.completed, p.p2p_started, p.p2p_completed
        );
    }
    for sl in &c.slowest {
        let _ = writeln!(
            s,
            "   latest arrival in {}: rank {} (last in {} of {}, mean {:.2} ms, max {:.2} ms after the first)",
            sl.op, sl.rank, sl.times_last, sl.of, sl.mean_late_ms, sl.max_late_ms
        );
    }
    let _ = writeln!(
        s,
        "   timeline (last {TEXT_TIMELINE} per rank; ms since the first operation):"
    );
    for t in &c.timeline {
        let items: Vec<String> = t
            .entries
            .iter()
            .rev()
            .take(TEXT_TIMELINE)
            .rev()
            .map(|e| {
                let tag = match e.kind.as_str() {
                    "p2p" => "p",
                    "comm" => "c",
                    _ => "#",
                };
                format!(
                    "{tag}{} {} {}@{:.1}",
                    e.seq,
                    e.op,
                    e.state,
                    e.started_ms.unwrap_or(e.enqueued_ms)
                )
            })
            .collect();
        let _ = writeln!(s, "     rank {}: {}", t.rank, items.join(" | "));
    }
}

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The web page: the verdict rendered on the server (readable without JavaScript), then the
/// per-rank timeline drawn by the embedded script, which refreshes from `/api/verdict` every
/// `refresh_ms` (0: never).
pub fn html(v: &Verdict, refresh_ms: u64) -> String {
    let mut verdict = String::new();
    let _ = write!(verdict, "<ul id=\"summary\">");
    for line in &v.summary {
        let _ = write!(verdict, "<li>{}</li>", escape(line));
    }
    let _ = write!(verdict, "</ul>");
    for c in &v.comms {
        let _ = write!(
            verdict,
            "<section class=\"comm\"><h2>comm <code>{}</code> <small>instance {}, {} ranks</small> \
             <span class=\"status {}\">{}</span></h2><ul>",
            escape(&c.name),
            c.instance,
            c.size,
            escape(&c.status),
            escape(&c.status.to_uppercase())
        );
        for f in &c.findings {
            let _ = write!(verdict, "<li>{}</li>", escape(f));
        }
        let _ = write!(
            verdict,
            "</ul><table><tr><th>rank</th><th>state</th><th>started</th><th>completed</th>\
             <th>current operation</th></tr>"
        );
        for p in &c.progress {
            let cur = p
                .current
                .as_ref()
                .map(|o| format!("{} seq {} {}", o.op, o.seq, o.state))
                .unwrap_or_else(|| "-".into());
            let _ = write!(
                verdict,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                p.rank,
                escape(&p.state),
                p.started,
                p.completed,
                escape(&cur)
            );
        }
        let _ = write!(verdict, "</table></section>");
    }
    let data = serde_json::to_string(v)
        .unwrap_or_else(|_| "{}".into())
        .replace("</", "<\\/");
    PAGE.replace("{{VERDICT}}", &verdict)
        .replace("{{DATA}}", &data)
        .replace("{{REFRESH}}", &refresh_ms.to_string())
}

const PAGE: &str = r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>comms-analyzer</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 .5em; }
h2 { font-size: 1.1em; margin: 1em 0 .3em; }
#summary li { font-weight: 600; }
.status { padding: 1px 8px; border-radius: 4px; color: #fff; background: #2a7; font-size: .85em; }
.status.mismatch, .status.hung, .status.failed { background: #c33; }
.status.incomplete, .status.running { background: #c80; }
table { border-collapse: collapse; margin: .3em 0 1em; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
.lane { position: relative; height: 20px; background: #f4f4f4; margin: 2px 0; }
.lane span.op { position: absolute; top: 2px; height: 16px; min-width: 2px; border-radius: 2px;
  font-size: 10px; color: #fff; overflow: hidden; white-space: nowrap; }
.completed { background: #4a8; } .started { background: #e90; } .queued { background: #999; }
.failed, .timed_out { background: #c33; }
.lanes { display: grid; grid-template-columns: 5em 1fr; gap: 0 .5em; align-items: center; }
#updated { color: #888; font-size: .85em; }
h3 { font-size: 1em; margin: .6em 0 .2em; }
table.seq td { font-size: 12px; color: #fff; text-align: center; }
table.seq td:first-child { color: #222; text-align: left; }
table.seq td.absent { background: #eee; color: #888; }
table.seq td.odd { outline: 3px solid #000; outline-offset: -3px; font-weight: 700; }
</style></head>
<body>
<h1>comms-analyzer</h1>
<div id="verdict">{{VERDICT}}</div>
<h2>Timeline per rank</h2>
<p id="updated"></p>
<div id="timeline"></div>
<script id="data" type="application/json">{{DATA}}</script>
<script>
"use strict";
const REFRESH = {{REFRESH}};
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;"}[c])); }
function renderVerdict(v) {
  let h = "<ul id=\"summary\">" + v.summary.map(l => "<li>" + esc(l) + "</li>").join("") + "</ul>";
  for (const c of v.comms) {
    h += "<section class=\"comm\"><h2>comm <code>" + esc(c.name) + "</code> <small>instance " + c.instance +
      ", " + c.size + " ranks</small> <span class=\"status " + esc(c.status) + "\">" + esc(c.status.toUpperCase()) +
      "</span></h2><ul>" + c.findings.map(f => "<li>" + esc(f) + "</li>").join("") + "</ul>";
    h += "<table><tr><th>rank</th><th>state</th><th>started</th><th>completed</th><th>current operation</th></tr>";
    for (const p of c.progress) {
      const cur = p.current ? p.current.op + " seq " + p.current.seq + " " + p.current.state : "-";
      h += "<tr><td>" + p.rank + "</td><td>" + esc(p.state) + "</td><td>" + p.started + "</td><td>" + p.completed +
        "</td><td>" + esc(cur) + "</td></tr>";
    }
    h += "</table></section>";
  }
  document.getElementById("verdict").innerHTML = h;
}
function renderSeqGrid(c) {
  const seqs = new Set();
  for (const t of c.timeline) for (const e of t.entries) if (e.kind === "collective") seqs.add(e.seq);
  const cols = [...seqs].sort((a, b) => a - b).slice(-12);
  if (cols.length === 0) return "";
  const odd = new Set();
  for (const m of c.mismatches) for (const r of m.odd_ranks) odd.add(m.seq + ":" + r);
  let h = "<table class=\"seq\"><tr><th>rank \\ seq</th>" + cols.map(s => "<th>" + s + "</th>").join("") + "</tr>";
  for (const t of c.timeline) {
    h += "<tr><td>rank " + t.rank + "</td>";
    for (const s of cols) {
      const e = t.entries.find(x => x.kind === "collective" && x.seq === s);
      const cls = e ? e.state : "absent";
      const mark = odd.has(s + ":" + t.rank) ? " odd" : "";
      h += "<td class=\"" + esc(cls) + mark + "\" title=\"" + (e ? esc(e.op + " " + e.state + (e.error ? "\n" + e.error : "")) : "not called") +
        "\">" + (e ? esc(e.op) : "&mdash;") + "</td>";
    }
    h += "</tr>";
  }
  return h + "</table>";
}
function renderTimeline(v) {
  let h = "";
  for (const c of v.comms) {
    let end = 1;
    for (const t of c.timeline) {
      end = Math.max(end, t.dumped_ms);
      for (const e of t.entries) end = Math.max(end, e.ended_ms || e.started_ms || e.enqueued_ms);
    }
    h += "<h2>comm <code>" + esc(c.name) + "</code>: collectives by sequence number</h2>" + renderSeqGrid(c);
    h += "<h3>by time <small>0 to " + end.toFixed(1) + " ms</small></h3><div class=\"lanes\">";
    for (const t of c.timeline) {
      h += "<div>rank " + t.rank + "</div><div class=\"lane\">";
      for (const e of t.entries) {
        const s = e.started_ms == null ? e.enqueued_ms : e.started_ms;
        const f = e.ended_ms == null ? t.dumped_ms : e.ended_ms;
        const left = 100 * s / end, width = Math.max(0.2, 100 * (f - s) / end);
        const tip = e.kind + " seq " + e.seq + " " + e.op + " " + e.state + (e.algorithm ? " [" + e.algorithm + "]" : "") +
          " " + s.toFixed(2) + "-" + f.toFixed(2) + " ms" + (e.error ? "\n" + e.error : "");
        h += "<span class=\"op " + esc(e.state) + "\" style=\"left:" + left + "%;width:" + width + "%\" title=\"" +
          esc(tip) + "\">" + esc(e.op) + "</span>";
      }
      h += "</div>";
    }
    h += "</div>";
  }
  document.getElementById("timeline").innerHTML = h;
}
function render(v, live) {
  if (live) renderVerdict(v);
  renderTimeline(v);
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}
render(JSON.parse(document.getElementById("data").textContent), false);
if (REFRESH > 0) {
  setInterval(() => fetch("/api/verdict").then(r => r.json()).then(v => render(v, true)).catch(() => {}), REFRESH);
}
</script>
</body></html>
"#;
