//! Cross-memory attach: copying straight out of another local rank's address space with
//! `process_vm_readv(2)`, one copy instead of two through a shared buffer. This is the only
//! place that names the system calls; callers pass a peer's pid and the address it published.
//!
//! Whether a rank may read another depends on the kernel's ptrace access rules (same user, Yama's
//! `ptrace_scope`, seccomp filters in containers), so the transport probes it between every pair
//! of local ranks at init and only uses it when every probe succeeded.

use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

use crate::span::Span;

/// Reads made for collectives by this process, and their bytes (see [`super::cma_stats`]).
static READS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
/// Window puts written by this process.
static PUTS: AtomicU64 = AtomicU64::new(0);

/// Window puts written so far (see [`super::cma_stats`]).
pub(crate) fn puts() -> u64 {
    PUTS.load(Ordering::Relaxed)
}

/// Counts one finished read of `bytes` made for a collective (the probe's are not counted).
pub(crate) fn count(bytes: usize) {
    READS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// (reads, bytes) counted so far.
pub(crate) fn counted() -> (u64, u64) {
    (READS.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed))
}

/// Copies `local.len()` bytes at `remote` in process `pid` into `local`.
///
/// `remote` must be an address the peer published for this operation and that it keeps valid,
/// unwritten, until this rank has signalled that it finished reading (the collectives' closing
/// barrier). A bad address or a gone process is an error, never memory unsafety here: the kernel
/// checks the remote range, and `local` is a valid span by its own contract.
pub(crate) fn read(pid: u32, remote: usize, local: Span) -> io::Result<()> {
    let pid = Pid::from_raw(pid as libc::pid_t);
    // SAFETY: `local` is this rank's destination for the operation: valid for writes of its
    // length (Span's contract) and read or written by no one else until the copy returns (the
    // collectives hand each destination to one reader at a time).
    unsafe { local.with_mut_slice(|dst| read_into(pid, remote, dst)) }
}

/// [`read`] into a slice, through nix's `process_vm_readv`, which lets the kernel validate the
/// remote range (EFAULT instead of touching anything of ours).
fn read_into(pid: Pid, remote: usize, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let rest = &mut dst[done..];
        let riov = [RemoteIoVec {
            base: remote + done,
            len: rest.len(),
        }];
        match process_vm_readv(pid, &mut [IoSliceMut::new(rest)], &riov) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "process_vm_readv moved no byte",
                ))
            }
            Ok(n) => done += n,
        }
    }
    Ok(())
}

/// Copies `local` to `remote` in process `pid` (a one-sided put into a peer's registered
/// window). `remote..remote + local.len()` must lie inside a region the peer registered, which
/// the caller checked against the peer's key; the kernel checks the remote range again (EFAULT
/// instead of touching anything else of ours).
pub(crate) fn write(pid: u32, remote: usize, local: Span) -> io::Result<()> {
    PUTS.fetch_add(1, Ordering::Relaxed);
    let pid = Pid::from_raw(pid as libc::pid_t);
    // SAFETY: `local` is the put's source, valid for reads of its length (Span's contract) and
    // kept unmodified by its owner until the put completes, which is when this returns.
    unsafe { local.with_slice(|src| write_from(pid, remote, src)) }
}

/// [`write`] from a slice, through nix's `process_vm_writev`.
fn write_from(pid: Pid, remote: usize, src: &[u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < src.len() {
        let rest = &src[done..];
        let riov = [RemoteIoVec {
            base: remote + done,
            len: rest.len(),
        }];
        match process_vm_writev(pid, &[IoSlice::new(rest)], &riov) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "process_vm_writev moved no byte",
                ))
            }
            Ok(n) => done += n,
        }
    }
    Ok(())
}

/// Yama's `ptrace_scope` (0: classic, 1: restricted to descendants, 2: admin only, 3: none), or
/// `None` when Yama is not built in.
pub(crate) fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Under Yama scope 1 a process may only read its descendants, so sibling ranks (children of one
/// launcher, as under torchrun) could not read each other. Declaring the parent as this
/// process's ptracer lets the parent and every descendant of it (the siblings) attach, and
/// nobody else. Returns whether the declaration was made (it is not needed under scope 0, and
/// cannot help under 2 and 3, or when the parent is init, which would open it to everyone).
pub(crate) fn allow_siblings() -> bool {
    if ptrace_scope() != Some(1) {
        return false;
    }
    let parent = std::os::unix::process::parent_id();
    if parent <= 1 {
        return false;
    }
    // SAFETY: prctl(PR_SET_PTRACER, pid) takes plain integers and changes only this process's
    // Yama exception; no memory is passed.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_PTRACER,
            parent as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    rc == 0
}
