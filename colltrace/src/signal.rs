//! SIGUSR1 makes every rank that receives it dump. `signal-hook` installs the handler, which
//! only wakes its self-pipe (async-signal-safe); a thread waiting on it does the dump.

use std::sync::OnceLock;

use signal_hook::consts::SIGUSR1;
use signal_hook::iterator::Signals;

use crate::schema::Trigger;

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

/// True when SIGUSR1 has its default disposition (no handler, not ignored).
fn has_default_disposition() -> std::io::Result<bool> {
    // SAFETY: an all-zero `sigaction` is a valid value of the plain C struct.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only queries the current one into `old`, which lives across
    // the call; nothing is changed.
    if unsafe { libc::sigaction(SIGUSR1, std::ptr::null(), &mut old) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(old.sa_sigaction == libc::SIG_DFL)
}

fn try_install() -> Result<bool, String> {
    // signal-hook would chain to a handler the application installed; leave that one alone
    // instead, so that SIGUSR1 keeps meaning what the application made it mean.
    if !has_default_disposition().map_err(|e| format!("sigaction: {e}"))? {
        tracing::warn!(
            "colltrace: SIGUSR1 already has a handler; leaving it (dump through the API instead)"
        );
        return Ok(false);
    }
    let mut signals = Signals::new([SIGUSR1]).map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("colltrace-signal".into())
        .spawn(move || {
            // Signals that arrive while a dump runs coalesce into one more dump.
            for _ in signals.forever() {
                match crate::registry::dump_configured(Trigger::Signal, Some("SIGUSR1")) {
                    Ok(paths) => tracing::warn!("colltrace: SIGUSR1: dumped {paths:?}"),
                    Err(e) => tracing::error!("colltrace: SIGUSR1: dump failed: {e}"),
                }
            }
        })
        .map_err(|e| format!("spawning the dump thread: {e}"))?;
    Ok(true)
}
