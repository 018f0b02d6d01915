//! `TORCHCOMMS_IBVERBS_LIB` pointing to a missing file: verbs are unavailable with the reason,
//! and the rest of the crate works (own process: the loader caches its first result).

use ibverbx::soft::{connect_pairs, Soft, SoftConfig, SoftFabric};
use ibverbx::verbs::DeviceList;
use ibverbx::{availability, Availability, Event, Put, VirtualCq, VirtualQp, VqpConfig};

#[test]
fn override_to_a_missing_library() {
    // SAFETY: the only test of this binary, run before anything reads the environment.
    unsafe { std::env::set_var("TORCHCOMMS_IBVERBS_LIB", "/nonexistent/libibverbs-test.so") };
    torchcomms_cvars::reload().unwrap();
    let av = availability();
    println!("branch: override to a missing file -> {av:?}");
    let Availability::NoLibrary(e) = &av else {
        panic!("{av:?}")
    };
    let reason = av.reason().unwrap();
    assert!(reason.starts_with("libibverbs not found"), "{reason}");
    assert!(reason.contains("/nonexistent/libibverbs-test.so"), "{e}");
    assert!(!ibverbx::supported());
    assert!(DeviceList::get().is_err());

    // The software provider does not need the library.
    let fabric = SoftFabric::new(SoftConfig::default());
    let (a, b) = (fabric.device("a"), fabric.device("b"));
    let (ca, cb) = (a.create_cq(), b.create_cq());
    let (qa, qb) = connect_pairs(&a, &ca, &b, &cb, 2).unwrap();
    let mut va = VirtualCq::<Soft>::new(ca);
    let mut vb = VirtualCq::<Soft>::new(cb);
    let tx = VirtualQp::new(&mut va, qa, VqpConfig::default()).unwrap();
    let _rx = VirtualQp::new(&mut vb, qb, VqpConfig::default()).unwrap();
    let (s, d) = (a.register(10), b.register(10));
    tx.put(&Put {
        wr_id: 5,
        local: s.local_key(),
        local_offset: 0,
        remote: d.remote_key(),
        remote_offset: 0,
        len: 10,
        notify: true,
    })
    .unwrap();
    let mut ev = Vec::new();
    while ev.len() < 2 {
        va.wait(&mut ev, std::time::Duration::from_secs(10)).ok();
        vb.poll(&mut ev).unwrap();
    }
    assert!(ev.iter().any(|e| matches!(
        e.event,
        Event::PutDone {
            wr_id: 5,
            result: Ok(()),
            ..
        }
    )));
    assert!(ev
        .iter()
        .any(|e| matches!(e.event, Event::Notify { seq: 0 })));
}
