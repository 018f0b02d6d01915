//! A connected pair of virtual QPs over the software fabric, and a driver that polls both
//! sides until what a test waits for arrived, with a deadline (a test never hangs).

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, Instant};

use ibverbx::soft::{connect_pairs, Soft, SoftConfig, SoftDevice, SoftFabric};
use ibverbx::{Event, Failure, VcMode, VirtualCq, VirtualQp, VqpConfig};

pub struct Pair {
    pub fabric: SoftFabric,
    pub a: SoftDevice,
    pub b: SoftDevice,
    pub vcq_a: VirtualCq<Soft>,
    pub vcq_b: VirtualCq<Soft>,
    pub tx: VirtualQp<Soft>,
    pub rx: Option<VirtualQp<Soft>>,
}

pub fn pair(nqps: usize, cfg: VqpConfig, soft: SoftConfig) -> Pair {
    let fabric = SoftFabric::new(soft);
    let (a, b) = (fabric.device("a"), fabric.device("b"));
    let (cq_a, cq_b) = (a.create_cq(), b.create_cq());
    let (qa, qb) = connect_pairs(&a, &cq_a, &b, &cq_b, nqps).unwrap();
    let mut vcq_a = VirtualCq::new(cq_a);
    let mut vcq_b = VirtualCq::new(cq_b);
    let tx = VirtualQp::new(&mut vcq_a, qa, cfg).unwrap();
    let rx = VirtualQp::new(&mut vcq_b, qb, cfg).unwrap();
    Pair {
        fabric,
        a,
        b,
        vcq_a,
        vcq_b,
        tx,
        rx: Some(rx),
    }
}

/// What the driver saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// (msg, wr_id, result) of the sender's puts, in the order reported.
    pub done: Vec<(u64, u64, Result<(), Failure>)>,
    /// Notification sequence numbers at the receiver, in order.
    pub notes: Vec<u64>,
    /// Receive failures of either side (side name, failure).
    pub recv_failed: Vec<(&'static str, Failure)>,
}

impl Pair {
    /// Polls both sides until `done` puts completed and `notes` notifications arrived, or
    /// fails after `timeout`.
    pub fn drive(&mut self, done: usize, notes: usize, timeout: Duration) -> Seen {
        let mut seen = Seen::default();
        self.drive_into(&mut seen, done, notes, timeout);
        seen
    }

    pub fn drive_into(&mut self, seen: &mut Seen, done: usize, notes: usize, timeout: Duration) {
        let start = Instant::now();
        let mut ev = Vec::new();
        while seen.done.len() < done || seen.notes.len() < notes {
            assert!(
                start.elapsed() < timeout,
                "timed out after {timeout:?}: {} of {done} puts done, {} of {notes} notifications; {seen:?}",
                seen.done.len(),
                seen.notes.len()
            );
            ev.clear();
            self.vcq_a.poll(&mut ev).unwrap();
            let from_a = ev.len();
            self.vcq_b.poll(&mut ev).unwrap();
            for (i, e) in ev.iter().enumerate() {
                let side = if i < from_a { "a" } else { "b" };
                match &e.event {
                    Event::PutDone {
                        wr_id, msg, result, ..
                    } => {
                        assert_eq!(side, "a", "only a sends");
                        seen.done.push((*msg, *wr_id, result.clone()));
                    }
                    Event::Notify { seq } => {
                        assert_eq!(side, "b", "only b is notified");
                        seen.notes.push(*seq);
                    }
                    Event::RecvFailed(f) => seen.recv_failed.push((side, f.clone())),
                }
            }
        }
    }
}

/// A byte pattern that differs per put and per offset.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (seed
                .wrapping_mul(31)
                .wrapping_add(i as u64 * 7 + (i as u64 >> 8))) as u8
        })
        .collect()
}

/// Settings of a test's virtual QPs: `mode`, chunks of `chunk` bytes, 16 outstanding per QP.
pub fn cfg(mode: VcMode, chunk: u64) -> VqpConfig {
    VqpConfig {
        chunk_bytes: chunk,
        mode,
        max_msgs_per_qp: 16,
        ..VqpConfig::default()
    }
}

/// A fabric that reorders across QPs and delivers completions partly, from `seed`.
pub fn shuffled(seed: u64) -> SoftConfig {
    SoftConfig {
        seed,
        reorder: true,
        partial: true,
        copy_data: true,
    }
}
