//! Typed settings of ibverbx, read from cvars once by [`IbConfig::from_cvars`]; the core types
//! take these structures, so tests never need the environment.

use torchcomms_cvars::Cvars;

use crate::error::{Error, Result};
use crate::hca::HcaSpec;
use crate::verbs::PathConfig;
use crate::virt::{VcMode, VqpConfig};

/// Every setting of a virtual connection over verbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbConfig {
    /// Physical QPs per virtual connection (`CTRAN_IB_MAX_QPS`).
    pub qps_per_connection: usize,
    /// Chunking, mode and outstanding limit (`CTRAN_IB_QP_SCALING_THRESHOLD`,
    /// `CTRAN_IB_VC_MODE`, `CTRAN_IB_QP_MAX_MSGS`).
    pub vqp: VqpConfig,
    /// Devices to use (`CTRAN_IB_HCA`).
    pub hca: HcaSpec,
    /// GID index; `None` picks one per port (`CTRAN_IB_GID_INDEX`).
    pub gid_index: Option<u8>,
    /// Traffic class, timeout and retries (`CTRAN_IB_TC`, `CTRAN_IB_TIMEOUT`,
    /// `CTRAN_IB_RETRY_CNT`); its `gid_index` is filled per port.
    pub path: PathConfig,
}

impl Default for IbConfig {
    fn default() -> IbConfig {
        IbConfig {
            qps_per_connection: 16,
            vqp: VqpConfig::default(),
            hca: HcaSpec::all(),
            gid_index: None,
            path: PathConfig::default(),
        }
    }
}

fn small<T: TryFrom<u64>>(name: &str, v: u64) -> Result<T> {
    T::try_from(v).map_err(|_| Error::BadConfig(format!("{name}={v} is out of range")))
}

impl IbConfig {
    /// From a loaded configuration.
    pub fn from_cvars(cv: &Cvars) -> Result<IbConfig> {
        let hca = match cv.ctran_ib_hca() {
            Some(s) => HcaSpec::parse(s)?,
            None => HcaSpec::all(),
        };
        Ok(IbConfig {
            qps_per_connection: small("CTRAN_IB_MAX_QPS", cv.ctran_ib_max_qps())?,
            vqp: VqpConfig {
                chunk_bytes: cv.ctran_ib_qp_scaling_threshold() as u64,
                mode: cv.ctran_ib_vc_mode().parse()?,
                max_msgs_per_qp: small("CTRAN_IB_QP_MAX_MSGS", cv.ctran_ib_qp_max_msgs())?,
                seq_bits: crate::virt::seq::SEQ_BITS,
            },
            hca,
            gid_index: cv
                .ctran_ib_gid_index()
                .map(|g| small("CTRAN_IB_GID_INDEX", g))
                .transpose()?,
            path: PathConfig {
                traffic_class: small("CTRAN_IB_TC", cv.ctran_ib_tc())?,
                timeout: small("CTRAN_IB_TIMEOUT", cv.ctran_ib_timeout())?,
                retry_cnt: small("CTRAN_IB_RETRY_CNT", cv.ctran_ib_retry_cnt())?,
                ..PathConfig::default()
            },
        })
    }

    /// From the process's current configuration (`torchcomms_cvars::current()`).
    pub fn from_env() -> Result<IbConfig> {
        IbConfig::from_cvars(&torchcomms_cvars::current())
    }

    /// The mode.
    pub fn mode(&self) -> VcMode {
        self.vqp.mode
    }
}
