//! Real RC queue pairs on a real device, loopback (both ends on one port). Runs only where
//! `ibv_get_device_list` finds a device; elsewhere it prints that it did not run and asserts
//! that there truly is no device.

use std::time::{Duration, Instant};

use ibverbx::verbs::{
    CompletionQueue, Context, DeviceList, MemoryRegion, PathConfig, QpCaps, QueuePair, Rts, Verbs,
    DEFAULT_ACCESS,
};
use ibverbx::{availability, Event, IbConfig, Put, VcMode, VirtualCq, VirtualQp, VqpConfig};

fn no_device_here() -> bool {
    let list = match DeviceList::get() {
        Ok(l) => l,
        Err(e) => {
            println!("hardware tests did not run: {e}");
            assert!(!availability().is_available());
            return true;
        }
    };
    if list.is_empty() {
        println!(
            "hardware tests did not run: {}",
            availability().reason().unwrap_or_default()
        );
        assert!(
            !std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()),
            "sysfs lists RDMA devices but libibverbs lists none"
        );
        return true;
    }
    false
}

/// Opens the first selected device with an active port.
fn open() -> (Context, u8) {
    let cfg = IbConfig::from_env().unwrap();
    let list = DeviceList::get().unwrap();
    for d in list.iter() {
        let ctx = Context::open(&d).unwrap();
        let ports = ctx.query_device().unwrap().phys_port_cnt;
        for port in 1..=ports {
            if cfg.hca.matches(&d.name(), port) && ctx.query_port(port).unwrap().active {
                println!("using {} port {port}", d.name());
                return (ctx, port);
            }
        }
    }
    panic!("devices are listed but none selected by CTRAN_IB_HCA has an active port");
}

fn loopback_qps(
    ctx: &Context,
    port: u8,
    n: usize,
) -> (
    ibverbx::verbs::ProtectionDomain,
    CompletionQueue,
    Vec<QueuePair<Rts>>,
    Vec<QueuePair<Rts>>,
) {
    let cfg = IbConfig::from_env().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = CompletionQueue::new(ctx, 4096).unwrap();
    let gid = ctx.pick_gid_index(port, cfg.gid_index).unwrap();
    let path = PathConfig {
        gid_index: gid,
        ..cfg.path
    };
    let mut a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..n {
        let x = QueuePair::new(&pd, &cq, port, QpCaps::default())
            .unwrap()
            .to_init()
            .unwrap();
        let y = QueuePair::new(&pd, &cq, port, QpCaps::default())
            .unwrap()
            .to_init()
            .unwrap();
        let (ex, ey) = (x.endpoint(gid).unwrap(), y.endpoint(gid).unwrap());
        // The endpoints travel as bytes, as they would through a store.
        let ex = ibverbx::verbs::QpEndpoint::from_bytes(&ex.to_bytes()).unwrap();
        let ey = ibverbx::verbs::QpEndpoint::from_bytes(&ey.to_bytes()).unwrap();
        a.push(x.to_rtr(&ey, &path).unwrap().to_rts(&path).unwrap());
        b.push(y.to_rtr(&ex, &path).unwrap().to_rts(&path).unwrap());
    }
    (pd, cq, a, b)
}

#[test]
fn device_port_and_gid_queries() {
    if no_device_here() {
        return;
    }
    let (ctx, port) = open();
    let attr = ctx.query_device().unwrap();
    let p = ctx.query_port(port).unwrap();
    let gid = ctx.query_gid(port, 0).unwrap();
    println!("{attr:?} {p:?} gid0 {gid:02x?}");
    assert!(attr.phys_port_cnt >= 1 && p.active);
}

#[test]
fn virtual_qp_loopback_on_real_qps() {
    if no_device_here() {
        return;
    }
    let (ctx, port) = open();
    for mode in [VcMode::Dqplb, VcMode::Spray] {
        let (pd, cq, a, b) = loopback_qps(&ctx, port, 4);
        // One CQ serves both ends: a single virtual CQ routes by QP number.
        let mut vcq = VirtualCq::<Verbs>::new(cq);
        let cfg = VqpConfig {
            chunk_bytes: 256 << 10,
            mode,
            max_msgs_per_qp: 64,
            ..VqpConfig::default()
        };
        let tx = VirtualQp::new(&mut vcq, a, cfg).unwrap();
        let rx = VirtualQp::new(&mut vcq, b, cfg).unwrap();
        let len = 8 << 20;
        let mut src = MemoryRegion::new(&pd, len, DEFAULT_ACCESS).unwrap();
        let dst = MemoryRegion::new(&pd, len, DEFAULT_ACCESS).unwrap();
        for (i, b) in src.as_mut_slice().unwrap().iter_mut().enumerate() {
            *b = (i * 7 + i / 4096) as u8;
        }
        for k in 0..4u64 {
            tx.put(&Put {
                wr_id: k,
                local: src.local_key(),
                local_offset: 0,
                remote: dst.remote_key(),
                remote_offset: 0,
                len: len as u64,
                notify: true,
            })
            .unwrap();
        }
        let (mut done, mut notes) = (0, 0);
        let start = Instant::now();
        let mut ev = Vec::new();
        while done < 4 || notes < 4 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out: {done} done, {notes} notes"
            );
            ev.clear();
            vcq.poll(&mut ev).unwrap();
            for e in &ev {
                match &e.event {
                    Event::PutDone { result, .. } => {
                        assert_eq!(e.conn, tx.id());
                        result.clone().unwrap();
                        done += 1;
                    }
                    Event::Notify { seq } => {
                        assert_eq!((e.conn, *seq), (rx.id(), notes));
                        notes += 1;
                    }
                    Event::RecvFailed(f) => panic!("{f}"),
                }
            }
        }
        assert!(src.as_slice() == dst.as_slice(), "{mode:?}: bytes differ");
        println!(
            "{mode:?}: 4 x {len} bytes over 4 loopback QPs in {:?}",
            start.elapsed()
        );
    }
}
