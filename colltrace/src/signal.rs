//! SIGUSR1 makes every rank that receives it dump. The handler only writes one byte to a pipe
//! (async-signal-safe); a thread reading the pipe does the dump.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::schema::Trigger;

/// Write end of the pipe, read by the handler (-1: not installed).
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_sigusr1(_: libc::c_int) {
    let fd = WRITE_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let saved = nix::errno::Errno::last_raw();
        let byte = 1u8;
        // SAFETY: write(2) is async-signal-safe; `byte` lives across the call; the fd stays
        // open for the life of the process (its OwnedFd is leaked into the dumper thread,
        // which never exits). A full pipe drops the byte: a dump is pending anyway.
        unsafe {
            libc::write(fd, (&raw const byte).cast(), 1);
        }
        nix::errno::Errno::set_raw(saved);
    }
}

/// Installs the handler once per process. Leaves an existing handler of the application in
/// place (and says so); returns whether ours is installed.
pub(crate) fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| match try_install() {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!("colltrace: cannot handle SIGUSR1: {e}");
            false
        }
    })
}

fn try_install() -> Result<bool, String> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: pipe2 succeeded, so both are fresh descriptors this code alone owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Blocking reads on the dumper's side.
    // SAFETY: fcntl on a descriptor we own, with valid flag arguments.
    unsafe {
        let flags = libc::fcntl(fds[0], libc::F_GETFL);
        libc::fcntl(fds[0], libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    WRITE_FD.store(fds[1], Ordering::SeqCst);
    let action = SigAction::new(
        SigHandler::Handler(on_sigusr1),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only calls async-signal-safe functions (write, errno access).
    let old = unsafe { sigaction(Signal::SIGUSR1, &action) }.map_err(|e| e.to_string())?;
    if !matches!(old.handler(), SigHandler::SigDfl) {
        // SAFETY: puts back exactly what was installed before.
        let _ = unsafe { sigaction(Signal::SIGUSR1, &old) };
        WRITE_FD.store(-1, Ordering::SeqCst);
        tracing::warn!(
            "colltrace: SIGUSR1 already has a handler; leaving it (dump through the API instead)"
        );
        return Ok(false);
    }
    std::thread::Builder::new()
        .name("colltrace-signal".into())
        .spawn(move || {
            let _keep_write_end = write;
            let mut file = std::fs::File::from(read);
            let mut buf = [0u8; 64];
            loop {
                match std::io::Read::read(&mut file, &mut buf) {
                    Ok(0) => return,
                    Ok(_) => {
                        match crate::registry::dump_configured(Trigger::Signal, Some("SIGUSR1")) {
                            Ok(paths) => tracing::warn!("colltrace: SIGUSR1: dumped {paths:?}"),
                            Err(e) => tracing::error!("colltrace: SIGUSR1: dump failed: {e}"),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::error!("colltrace: signal pipe: {e}");
                        return;
                    }
                }
            }
        })
        .map_err(|e| format!("spawning the dump thread: {e}"))?;
    Ok(true)
}
