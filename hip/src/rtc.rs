//! Run-time compilation of the project's kernel sources for AMD GPUs through hiprtc: the same
//! sources NVRTC compiles for NVIDIA GPUs (`gpu_compat.cuh` holds what differs), compiled for
//! the device's architecture (`gfx90a`, `gfx942`, ...) into a code object that
//! `hipModuleLoadData` loads.

use std::ffi::{c_char, CString};

use crate::error::{HipError, Result};
use crate::sys::{self, RtcProgram, RtcStatus, HIPRTC_SUCCESS};

/// hiprtc's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32)> {
    let rtc = sys::rtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid out-pointers.
    let code = unsafe { (rtc.hiprtcVersion)(&mut major, &mut minor) };
    rtc_check("hiprtcVersion", "", "", code)?;
    Ok((major, minor))
}

fn rtc_error_string(code: RtcStatus) -> String {
    let Ok(rtc) = sys::rtc() else {
        return format!("hiprtcResult {code}");
    };
    // SAFETY: hiprtcGetErrorString takes any value and returns a static string or null.
    let p = unsafe { (rtc.hiprtcGetErrorString)(code) };
    if p.is_null() {
        return format!("hiprtcResult {code}");
    }
    // SAFETY: non-null, NUL-terminated and static.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

fn rtc_check(call: &str, name: &str, arch: &str, code: RtcStatus) -> Result<()> {
    if code == HIPRTC_SUCCESS {
        return Ok(());
    }
    Err(HipError::Compile {
        name: name.into(),
        arch: arch.into(),
        log: format!("{call}: {}", rtc_error_string(code)),
    })
}

/// A hiprtc program, destroyed on drop.
struct Program(RtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        if let Ok(rtc) = sys::rtc() {
            // SAFETY: the program came from hiprtcCreateProgram and is destroyed once.
            let code = unsafe { (rtc.hiprtcDestroyProgram)(&mut self.0) };
            if code != HIPRTC_SUCCESS {
                tracing::warn!("hiprtcDestroyProgram: {}", rtc_error_string(code));
            }
        }
    }
}

/// Compiles `source` (named `name` in messages) for the AMD architecture `arch` (`gfx90a`) and
/// returns the code object. Needs hiprtc, not a GPU: compilation runs on the CPU.
pub fn compile(name: &str, source: &str, arch: &str) -> Result<Vec<u8>> {
    let rtc = sys::rtc()?;
    let csrc = CString::new(source).map_err(|_| HipError::Nul {
        what: "kernel source",
    })?;
    let cname = CString::new(name).map_err(|_| HipError::Nul {
        what: "source name",
    })?;
    let opts = [format!("--offload-arch={arch}"), "-O3".to_string()]
        .into_iter()
        .map(CString::new)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| HipError::Nul { what: "option" })?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

    let mut raw: RtcProgram = std::ptr::null_mut();
    // SAFETY: the strings live across the call; no headers are passed (null arrays, count 0).
    let code = unsafe {
        (rtc.hiprtcCreateProgram)(
            &mut raw,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    rtc_check("hiprtcCreateProgram", name, arch, code)?;
    let prog = Program(raw);

    // SAFETY: `prog` is live and `opt_ptrs` holds opts.len() live C strings.
    let code =
        unsafe { (rtc.hiprtcCompileProgram)(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if code != HIPRTC_SUCCESS {
        let log = program_log(&prog).unwrap_or_default();
        return Err(HipError::Compile {
            name: name.into(),
            arch: arch.into(),
            log: format!("{}: {log}", rtc_error_string(code)),
        });
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled; `size` is a valid out-pointer.
    let code = unsafe { (rtc.hiprtcGetCodeSize)(prog.0, &mut size) };
    rtc_check("hiprtcGetCodeSize", name, arch, code)?;
    let mut out = vec![0u8; size];
    // SAFETY: `out` holds the `size` bytes hiprtc reported.
    let code = unsafe { (rtc.hiprtcGetCode)(prog.0, out.as_mut_ptr().cast()) };
    rtc_check("hiprtcGetCode", name, arch, code)?;
    Ok(out)
}

fn program_log(prog: &Program) -> Result<String> {
    let rtc = sys::rtc()?;
    let mut size = 0usize;
    // SAFETY: `prog` is live; `size` is a valid out-pointer.
    let code = unsafe { (rtc.hiprtcGetProgramLogSize)(prog.0, &mut size) };
    rtc_check("hiprtcGetProgramLogSize", "", "", code)?;
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: `log` holds the `size` bytes hiprtc reported (at least one).
    let code = unsafe { (rtc.hiprtcGetProgramLog)(prog.0, log.as_mut_ptr().cast()) };
    rtc_check("hiprtcGetProgramLog", "", "", code)?;
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    Ok(String::from_utf8_lossy(&log[..end]).into_owned())
}
