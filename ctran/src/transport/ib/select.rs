//! Which RDMA port a rank's ib transport opens with the verbs provider, as a pure function of
//! what was found (so it is tested without a device); `route.rs` opens it and routes peers.

use ibverbx::HcaSpec;

/// One port of an RDMA device that verbs listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePort {
    /// Device name (`mlx5_0`).
    pub device: String,
    /// Port number (from 1).
    pub port: u8,
}

/// What verbs offer in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IbProbe {
    /// The library loaded; these ports are active.
    Ports(Vec<DevicePort>),
    /// Verbs cannot be used ([`ibverbx::Availability::reason`]).
    Unavailable(String),
}

impl IbProbe {
    /// From ibverbx's availability, with the ports found when it is available.
    pub fn from_availability(a: &ibverbx::Availability, ports: Vec<DevicePort>) -> IbProbe {
        match a.reason() {
            Some(why) => IbProbe::Unavailable(why),
            None => IbProbe::Ports(ports),
        }
    }
}

/// Lists the active ports of this machine's RDMA devices (loads libibverbs). A device that
/// cannot be opened or queried is skipped with a debug log.
pub fn probe() -> IbProbe {
    use ibverbx::verbs::{Context, DeviceList};
    let a = ibverbx::availability();
    if let Some(why) = a.reason() {
        return IbProbe::Unavailable(why);
    }
    let list = match DeviceList::get() {
        Ok(l) => l,
        Err(e) => return IbProbe::Unavailable(e.to_string()),
    };
    let mut ports = Vec::new();
    for dev in list.iter() {
        let name = dev.name();
        let found = Context::open(&dev).and_then(|ctx| {
            let n = ctx.query_device()?.phys_port_cnt;
            let mut active = Vec::new();
            for port in 1..=n {
                if ctx.query_port(port)?.active {
                    active.push(port);
                }
            }
            Ok(active)
        });
        match found {
            Ok(active) => ports.extend(active.into_iter().map(|port| DevicePort {
                device: name.clone(),
                port,
            })),
            Err(e) => tracing::debug!("ib: skipping device {name}: {e}"),
        }
    }
    IbProbe::Ports(ports)
}

/// Whether ib is used for remote peers, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IbChoice {
    /// Use this port.
    Use(DevicePort),
    /// Not used; the reason is logged ("ib: not used: ...").
    NotUsed(String),
}

/// Decides for the whole communicator: ib needs `ib` in `CTRAN_BACKENDS`, usable verbs, and a
/// port that `CTRAN_IB_HCA` selects (the first such port is used).
pub fn choose(backends: &[&str], probe: &IbProbe, hca: &HcaSpec) -> IbChoice {
    if !backends.contains(&"ib") {
        return IbChoice::NotUsed("not in CTRAN_BACKENDS".into());
    }
    let ports = match probe {
        IbProbe::Unavailable(why) => return IbChoice::NotUsed(why.clone()),
        IbProbe::Ports(p) if p.is_empty() => {
            return IbChoice::NotUsed("no RDMA device".into());
        }
        IbProbe::Ports(p) => p,
    };
    match ports.iter().find(|p| hca.matches(&p.device, p.port)) {
        Some(p) => IbChoice::Use(p.clone()),
        None => IbChoice::NotUsed(format!(
            "no device matches CTRAN_IB_HCA={hca} (found {})",
            ports
                .iter()
                .map(|p| format!("{}:{}", p.device, p.port))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(d: &str, p: u8) -> DevicePort {
        DevicePort {
            device: d.into(),
            port: p,
        }
    }

    #[test]
    fn ib_needs_the_backend_a_device_and_a_matching_hca() {
        let all = HcaSpec::all();
        let present = IbProbe::Ports(vec![port("mlx5_0", 1), port("mlx5_1", 1)]);
        let with_ib = ["socket", "shm", "ib"];
        assert_eq!(
            choose(&with_ib, &present, &all),
            IbChoice::Use(port("mlx5_0", 1))
        );
        // Not asked for: the default list has no ib.
        assert!(matches!(
            choose(&["socket", "shm", "nvl"], &present, &all),
            IbChoice::NotUsed(w) if w.contains("CTRAN_BACKENDS")
        ));
        // No library, or no device.
        let none = IbProbe::Unavailable("no RDMA device (libibverbs at x lists none)".into());
        assert!(matches!(
            choose(&with_ib, &none, &all),
            IbChoice::NotUsed(w) if w.contains("no RDMA device")
        ));
        assert!(matches!(
            choose(&with_ib, &IbProbe::Ports(vec![]), &all),
            IbChoice::NotUsed(w) if w.contains("no RDMA device")
        ));
        // The HCA list picks or excludes.
        let only1 = HcaSpec::parse("=mlx5_1").unwrap();
        assert_eq!(
            choose(&with_ib, &present, &only1),
            IbChoice::Use(port("mlx5_1", 1))
        );
        let exclude = HcaSpec::parse("^mlx5").unwrap();
        assert!(matches!(
            choose(&with_ib, &present, &exclude),
            IbChoice::NotUsed(w) if w.contains("CTRAN_IB_HCA") && w.contains("mlx5_0:1")
        ));
    }

    #[test]
    fn probing_this_machine_fails_as_a_value_or_lists_ports() {
        match probe() {
            IbProbe::Unavailable(why) => {
                assert!(!ibverbx::availability().is_available());
                println!("ib: not used: {why}");
            }
            IbProbe::Ports(p) => println!("ib: active ports {p:?}"),
        }
    }

    #[test]
    fn this_machine_keeps_its_routes() {
        // Whatever this machine has, the default backends never choose ib.
        let probe = IbProbe::from_availability(&ibverbx::availability(), vec![]);
        let cv = torchcomms_cvars::current();
        let backends: &[&str] = cv.ctran_backends();
        let choice = choose(backends, &probe, &HcaSpec::all());
        if !backends.contains(&"ib") {
            assert!(matches!(choice, IbChoice::NotUsed(_)));
        }
    }
}
