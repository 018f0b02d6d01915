//! Every fuzz target over its seeds, its corpus (`fuzz/corpus/<target>/`) and the inputs that
//! once made it fail (`fuzz/regressions/<target>/`), under a plain `cargo test`: the decoders
//! stay covered without libFuzzer, and a fixed crash cannot come back.

use std::path::{Path, PathBuf};

use torchcomms_fuzz::{seeds, target, TARGETS};

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn every_target_has_seeds_and_they_run() {
    let seeds = seeds();
    for t in TARGETS {
        let mine: Vec<_> = seeds.iter().filter(|(n, _, _)| *n == t.name).collect();
        assert!(!mine.is_empty(), "target {} has no seed", t.name);
        for (_, name, bytes) in mine {
            eprintln!("{}: seed {name}", t.name);
            (t.run)(bytes);
        }
    }
    for (n, name, _) in &seeds {
        assert!(target(n).is_some(), "seed {name} names no target {n}");
    }
}

#[test]
fn corpus_and_past_crashes_run_without_failing() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut ran = 0;
    for t in TARGETS {
        for dir in ["corpus", "regressions"] {
            for f in files(&root.join(dir).join(t.name)) {
                let bytes = std::fs::read(&f).unwrap();
                eprintln!("{}: {}", t.name, f.display());
                (t.run)(&bytes);
                ran += 1;
            }
        }
    }
    // The committed corpus holds at least the seeds of every target.
    assert!(ran >= TARGETS.len(), "only {ran} corpus files found");
}

/// Writes the seeds into `fuzz/corpus/<target>/seed-<name>` (run by `scripts/fuzz.sh`).
#[test]
#[ignore = "writes into fuzz/corpus; scripts/fuzz.sh runs it"]
fn write_seeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (t, name, bytes) in seeds() {
        let dir = root.join(t);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
}
