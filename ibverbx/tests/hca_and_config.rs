//! `CTRAN_IB_HCA` parsing and matching (NCCL_IB_HCA's syntax), and settings from cvars.

use ibverbx::{HcaEntry, HcaSpec, IbConfig, VcMode};
use torchcomms_cvars::Cvars;

#[test]
fn parses_nccl_syntax() {
    let s = HcaSpec::parse("mlx5_0:1, mlx5_3").unwrap();
    assert!(!s.exclude && !s.exact);
    assert_eq!(
        s.entries,
        vec![
            HcaEntry {
                name: "mlx5_0".into(),
                port: Some(1)
            },
            HcaEntry {
                name: "mlx5_3".into(),
                port: None
            },
        ]
    );
    let s = HcaSpec::parse("^=mlx5_1:2").unwrap();
    assert!(s.exclude && s.exact);
    assert_eq!(s.to_string(), "^=mlx5_1:2");
    assert_eq!(HcaSpec::parse("").unwrap(), HcaSpec::all());
    for bad in [
        "mlx5_0:",
        "mlx5_0:x",
        "mlx5_0:0",
        "a,,b",
        "^",
        "=",
        "^=",
        ":1",
        "mlx5_0:300",
    ] {
        let e = HcaSpec::parse(bad).unwrap_err();
        assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
    }
}

#[test]
fn matches_like_nccl() {
    let devs = ["mlx5_0", "mlx5_1", "mlx5_10", "bnxt_re0"];
    let pick = |spec: &str, port: u8| -> Vec<&str> {
        let s = HcaSpec::parse(spec).unwrap();
        devs.iter()
            .copied()
            .filter(|d| s.matches(d, port))
            .collect()
    };
    assert_eq!(pick("", 1), devs);
    // Prefix match by default: mlx5_1 also selects mlx5_10.
    assert_eq!(pick("mlx5_1", 1), ["mlx5_1", "mlx5_10"]);
    assert_eq!(pick("=mlx5_1", 1), ["mlx5_1"]);
    assert_eq!(pick("mlx5", 1), ["mlx5_0", "mlx5_1", "mlx5_10"]);
    assert_eq!(pick("^mlx5", 1), ["bnxt_re0"]);
    assert_eq!(pick("^=mlx5_1", 1), ["mlx5_0", "mlx5_10", "bnxt_re0"]);
    // Ports.
    assert_eq!(pick("=mlx5_0:1", 1), ["mlx5_0"]);
    assert!(pick("=mlx5_0:1", 2).is_empty());
    assert_eq!(pick("^=mlx5_0:1", 2), devs, "excluding port 1 keeps port 2");
    assert_eq!(pick("^=mlx5_0:1", 1), ["mlx5_1", "mlx5_10", "bnxt_re0"]);
}

#[test]
fn settings_from_cvars() {
    let d = IbConfig::from_cvars(&Cvars::load_from(|_| None).unwrap()).unwrap();
    assert_eq!(d, IbConfig::default());
    assert_eq!(d.vqp.chunk_bytes, 512 << 10);
    assert_eq!(
        (d.path.timeout, d.path.retry_cnt, d.path.traffic_class),
        (20, 7, 0)
    );

    let env = |k: &str| {
        Some(
            match k {
                "CTRAN_IB_MAX_QPS" => "4",
                "CTRAN_IB_QP_SCALING_THRESHOLD" => "1M",
                "CTRAN_IB_VC_MODE" => "spray",
                "CTRAN_IB_HCA" => "=mlx5_0:1,mlx5_2",
                "CTRAN_IB_GID_INDEX" => "3",
                "CTRAN_IB_TC" => "106",
                "CTRAN_IB_TIMEOUT" => "18",
                "CTRAN_IB_RETRY_CNT" => "5",
                "CTRAN_IB_QP_MAX_MSGS" => "32",
                _ => return None,
            }
            .to_string(),
        )
    };
    let c = IbConfig::from_cvars(&Cvars::load_from(env).unwrap()).unwrap();
    assert_eq!(c.qps_per_connection, 4);
    assert_eq!(c.vqp.chunk_bytes, 1 << 20);
    assert_eq!(c.mode(), VcMode::Spray);
    assert_eq!(c.vqp.max_msgs_per_qp, 32);
    assert_eq!(c.hca, HcaSpec::parse("=mlx5_0:1,mlx5_2").unwrap());
    assert_eq!(c.gid_index, Some(3));
    assert_eq!(
        (c.path.traffic_class, c.path.timeout, c.path.retry_cnt),
        (106, 18, 5)
    );

    let bad = |k: &str| (k == "CTRAN_IB_HCA").then(|| "mlx5_0:zero".to_string());
    let e = IbConfig::from_cvars(&Cvars::load_from(bad).unwrap()).unwrap_err();
    assert!(e.to_string().contains("mlx5_0:zero"), "{e}");
    let bad = |k: &str| (k == "CTRAN_IB_RETRY_CNT").then(|| "9".to_string());
    assert!(Cvars::load_from(bad).is_err(), "retries are 0..=7");
}
