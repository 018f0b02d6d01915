//! Run-time loading against whatever this machine has: asserts the branch that matches what
//! is installed (found independently of the crate) and prints which one ran.

use std::path::Path;

use ibverbx::verbs::DeviceList;
use ibverbx::{availability, supported, Availability, Error, LoadError};

fn library_present() -> bool {
    // SAFETY: loading libibverbs only registers its providers.
    unsafe { libloading::Library::new("libibverbs.so.1") }.is_ok()
}

fn devices_present() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[test]
fn availability_matches_what_is_installed() {
    assert!(
        std::env::var_os("TORCHCOMMS_IBVERBS_LIB").is_none(),
        "unset TORCHCOMMS_IBVERBS_LIB for this test"
    );
    let av = availability();
    match (library_present(), devices_present()) {
        (false, _) => {
            println!("branch: libibverbs absent -> {av:?}");
            assert!(
                matches!(av, Availability::NoLibrary(LoadError::NotFound { .. })),
                "{av:?}"
            );
            assert!(
                av.reason().unwrap().starts_with("libibverbs not found"),
                "{av:?}"
            );
            assert!(matches!(DeviceList::get(), Err(Error::Load(_))));
        }
        (true, false) => {
            println!("branch: libibverbs present, no RDMA device -> {av:?}");
            assert!(matches!(av, Availability::NoDevice { .. }), "{av:?}");
            assert!(av.reason().unwrap().contains("no RDMA device"), "{av:?}");
            assert!(DeviceList::get().unwrap().is_empty());
        }
        (true, true) => {
            println!("branch: libibverbs present with devices -> {av:?}");
            assert!(av.is_available(), "{av:?}");
            let list = DeviceList::get().unwrap();
            assert!(!list.is_empty());
            for d in list.iter() {
                println!("device {}", d.name());
            }
        }
    }
    assert_eq!(supported(), av.is_available());
}

#[test]
fn a_missing_or_incomplete_library_fails_as_a_value() {
    let err = ibverbx::loader::load(&["/nonexistent/libibverbs.so.1".into()]).unwrap_err();
    assert!(
        matches!(&err, LoadError::NotFound { tried } if tried.contains("/nonexistent")),
        "{err}"
    );
    assert!(err.to_string().starts_with("libibverbs not found"));
    // A library that is there but is not libibverbs names the first symbol it lacks.
    let libc = ["libc.so.6", "libc.so"]
        .into_iter()
        // SAFETY: libc is already loaded in every process.
        .find(|p| unsafe { libloading::Library::new(*p) }.is_ok());
    if let Some(libc) = libc {
        let err = ibverbx::loader::load(&[libc.into()]).unwrap_err();
        assert!(
            matches!(
                err,
                LoadError::MissingSymbol {
                    symbol: "ibv_get_device_list",
                    ..
                }
            ),
            "{err}"
        );
    }
    assert!(!Path::new("/nonexistent").exists());
}
