//! Rank 0's tables: header lines, rows, and how `auto` compares with the best algorithm.

use std::cell::Cell;
use std::io::Write;

use super::row::{paired_ratio, Row};
use crate::cli::CollOp;

/// auto counts as good as the best algorithm within this factor of its time.
pub(super) const AUTO_TOLERANCE: f64 = 1.10;

/// One line of a table: a measured row, or the text of one that could not be measured.
#[derive(Debug, Clone)]
pub(super) enum Entry {
    Row(Row),
    Na(String),
}

/// Table output of rank 0.
pub(super) struct Printer {
    pub(super) on: bool,
    /// Set once stdout failed (a closed pipe): the run goes on, since the other ranks need
    /// this one, and the rows still reach `--json`.
    pub(super) broken: Cell<bool>,
}

impl Printer {
    pub(super) fn line(&self, s: impl AsRef<str>) {
        if !self.on || self.broken.get() {
            return;
        }
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{}", s.as_ref()).and_then(|()| out.flush()) {
            tracing::warn!("cannot print the table any more: {e}");
            self.broken.set(true);
        }
    }

    pub(super) fn table_header(&self, op: CollOp, algo: Option<&str>) {
        self.line("#");
        match algo {
            Some(a) => self.line(format!("# {} algo {a}", op.name())),
            None => self.line(format!("# {}", op.name())),
        }
        self.line(format!(
            "# {:>10} {:>12} {:>6} {:>10} {:>5} {:>11} {:>12} {:>12} {:>7}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time(us)",
            "algbw(GB/s)",
            "busbw(GB/s)",
            "#wrong"
        ));
        self.line(format!("# {:>10} {:>12}", "(B)", "(elements)"));
    }

    pub(super) fn entry(&self, e: &Entry) {
        match e {
            Entry::Row(r) => self.row(r),
            Entry::Na(text) => self.line(text),
        }
    }

    /// `--algo all`: for every size, the best algorithm and how auto compares; returns (sizes
    /// where auto is within [`AUTO_TOLERANCE`] of the best, sizes compared).
    pub(super) fn auto_summary(
        &self,
        op: CollOp,
        algos: &[Option<String>],
        auto: usize,
        lines: &[Vec<Entry>],
    ) -> (usize, usize) {
        self.line("#");
        self.line(format!(
            "# {}: auto against the best algorithm: the one auto trails most by the median over \
             rounds of auto's time over its time in the same round (auto/best); times of the best \
             round",
            op.name()
        ));
        self.line(format!(
            "# {:>10} {:>6} {:>10} {:>18} {:>11} {:>11} {:>9}",
            "size", "type", "redop", "best", "best(us)", "auto(us)", "auto/best"
        ));
        let (mut within, mut of) = (0, 0);
        for line in lines {
            let Entry::Row(a) = &line[auto] else {
                continue;
            };
            let best = line
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != auto)
                .filter_map(|(k, e)| match e {
                    Entry::Row(r) => Some((k, r, paired_ratio(a, r))),
                    Entry::Na(_) => None,
                })
                .max_by(|x, y| x.2.total_cmp(&y.2));
            let Some((k, b, ratio)) = best else {
                continue;
            };
            of += 1;
            let ok = ratio <= AUTO_TOLERANCE;
            within += usize::from(ok);
            self.line(format!(
                "  {:>10} {:>6} {:>10} {:>18} {:>11.2} {:>11.2} {:>9.2}{}",
                a.bytes,
                a.dtype,
                a.redop,
                algos[k].as_deref().unwrap_or("-"),
                b.time_us,
                a.time_us,
                ratio,
                if ok { "" } else { "  *" }
            ));
        }
        self.line(format!(
            "# {}: auto within {:.0}% of the best algorithm at {within} of {of} sizes (* beyond)",
            op.name(),
            (AUTO_TOLERANCE - 1.0) * 100.0
        ));
        (within, of)
    }

    pub(super) fn row(&self, r: &Row) {
        let root = r.root.map_or_else(|| "-1".to_string(), |x| x.to_string());
        let wrong = r.wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
        self.line(format!(
            "  {:>10} {:>12} {:>6} {:>10} {:>5} {:>11.2} {:>12.3} {:>12.3} {:>7}",
            r.bytes, r.count, r.dtype, r.redop, root, r.time_us, r.algbw_gbps, r.busbw_gbps, wrong
        ));
    }
}
