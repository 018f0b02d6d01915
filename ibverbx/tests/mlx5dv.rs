//! libmlx5 loaded at run time: Debian's (rdma-core's `ibverbs-providers`) loads where it is
//! installed, a missing one is a value naming what was tried, and the choice between Data
//! Direct and plain verbs registration of GPU memory.

use ibverbx::mlx5dv::{self, dmabuf_registration, DmabufRegistration};

fn installed() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu/libmlx5.so.1",
        "/usr/lib64/libmlx5.so.1",
        "/usr/lib/libmlx5.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

#[test]
fn the_installed_libmlx5_loads_or_its_absence_is_a_reason() {
    match mlx5dv::load(&["libmlx5.so.1".into()]) {
        Ok(lib) => {
            println!(
                "libmlx5 at {}: Data Direct registration {}",
                lib.path,
                if lib.has_data_direct() {
                    "offered"
                } else {
                    "not offered (rdma-core < 52)"
                }
            );
        }
        Err(why) => {
            assert!(
                !installed(),
                "libmlx5.so.1 is installed but did not load: {why}"
            );
            assert!(why.contains("libmlx5.so.1"), "{why}");
            println!("no libmlx5 here: {why}");
        }
    }
}

#[test]
fn a_missing_library_names_every_path_tried() {
    let why =
        mlx5dv::load(&["/nonexistent/libmlx5.so.1".into(), "libmlx5-none.so".into()]).unwrap_err();
    assert!(why.starts_with("libmlx5 not found"), "{why}");
    assert!(
        why.contains("/nonexistent/libmlx5.so.1") && why.contains("libmlx5-none.so"),
        "{why}"
    );
}

#[test]
fn data_direct_only_where_the_device_the_library_and_the_setting_all_allow_it() {
    use DmabufRegistration::{DataDirect, Verbs};
    for device in [false, true] {
        for lib in [false, true] {
            for allowed in [false, true] {
                let want = if device && lib && allowed {
                    DataDirect
                } else {
                    Verbs
                };
                assert_eq!(
                    dmabuf_registration(device, lib, allowed),
                    want,
                    "{device} {lib} {allowed}"
                );
            }
        }
    }
}
