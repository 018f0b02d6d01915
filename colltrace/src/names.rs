//! Interned names: the `&'static str`s of a record (op, dtype, reduction, algorithm,
//! transport) as 16-bit codes, so that a record is a few fixed-size words written in place.
//!
//! A process-wide open-addressing table keyed by the string's address: a lookup on the hot path
//! is one hash and, in the common case, one comparison; the first use of a name takes a lock.
//! Entries are never removed. The same text at two addresses gets two codes with the same text.

use std::sync::{Mutex, OnceLock};

/// Table size (distinct names a process can have; ops, dtypes, reductions, algorithms and
/// transports together are about a hundred).
const SLOTS: usize = 1024;

static TABLE: [OnceLock<&'static str>; SLOTS] = [const { OnceLock::new() }; SLOTS];
static INSERT: Mutex<()> = Mutex::new(());

/// Code of "no name".
pub(crate) const NONE: u16 = 0;
/// Code of a name that did not fit in the table.
const FULL: u16 = u16::MAX;
/// What a dump shows for [`FULL`].
const FULL_TEXT: &str = "(name table full)";

#[inline]
fn same(a: &'static str, b: &'static str) -> bool {
    std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()
}

#[inline]
fn home(s: &'static str) -> usize {
    let h = (s.as_ptr() as usize as u64 ^ (s.len() as u64).rotate_left(40))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 54) as usize % SLOTS
}

/// The code of `s` (never [`NONE`]).
#[inline]
pub(crate) fn code(s: &'static str) -> u16 {
    let h = home(s);
    for i in 0..SLOTS {
        let k = (h + i) % SLOTS;
        match TABLE[k].get() {
            Some(t) if same(t, s) => return k as u16 + 1,
            Some(_) => {}
            None => return insert(s, h),
        }
    }
    FULL
}

/// The code of `s`, [`NONE`] for `None`.
#[inline]
pub(crate) fn opt_code(s: Option<&'static str>) -> u16 {
    s.map_or(NONE, code)
}

#[cold]
fn insert(s: &'static str, h: usize) -> u16 {
    let _g = INSERT.lock().unwrap_or_else(|p| p.into_inner());
    for i in 0..SLOTS {
        let k = (h + i) % SLOTS;
        match TABLE[k].get() {
            Some(t) if same(t, s) => return k as u16 + 1,
            Some(_) => {}
            None => {
                // Only inserters set entries, and they hold the lock.
                let _ = TABLE[k].set(s);
                return k as u16 + 1;
            }
        }
    }
    FULL
}

/// The name of `code`; `None` for [`NONE`].
pub(crate) fn name(code: u16) -> Option<&'static str> {
    match code {
        NONE => None,
        FULL => Some(FULL_TEXT),
        c => Some(TABLE[usize::from(c) - 1].get().copied().unwrap_or("?")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        let names: Vec<&'static str> = (0..200)
            .map(|i| &*Box::leak(format!("name{i}").into_boxed_str()))
            .collect();
        let codes: Vec<u16> = names.iter().map(|n| code(n)).collect();
        for (n, c) in names.iter().zip(&codes) {
            assert_ne!(*c, NONE);
            assert_eq!(code(n), *c, "stable");
            assert_eq!(name(*c), Some(*n));
        }
        let mut unique = codes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), codes.len());
        assert_eq!(opt_code(None), NONE);
        assert_eq!(name(NONE), None);
    }
}
