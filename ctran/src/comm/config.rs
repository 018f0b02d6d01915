//! Settings of one communicator. Defaults come from the environment (the cvars layer owns the
//! full list); callers override per communicator.

use std::time::Duration;

use crate::algos::select::{AlgoConfig, Choice, Collective, CostOverrides};
use crate::error::{Error, Result};
use crate::transport::shm::ShmConfig;
use crate::transport::socket::{Protection, SocketConfig};

pub use torchcomms_core::DEFAULT_TIMEOUT;

/// Everything a communicator needs to know besides its store.
#[derive(Debug, Clone)]
pub struct CommConfig {
    /// Name, unique in the process; prefixes the store keys of this communicator.
    pub name: String,
    /// The store serves this communicator alone: its keys carry no per-name instance number
    /// (which ranks renumbered by a reconfiguration would disagree on).
    pub dedicated_store: bool,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Deadline for init and the default for every operation.
    pub timeout: Duration,
    /// Size of one staging chunk: large messages move through a few of these, never whole.
    pub chunk_bytes: usize,
    /// GPU buffers over host transports: bytes per pipelined step (`CTRAN_GPE_CHUNK_BYTES`).
    pub gpe_chunk_bytes: usize,
    /// GPU buffers over host transports: the pinned staging ring (`CTRAN_GPE_STAGING_BYTES`).
    pub gpe_staging_bytes: usize,
    /// TCP transport settings.
    pub socket: SocketConfig,
    /// Deadline of each connection's handshake (`TORCHCOMMS_HANDSHAKE_TIMEOUT_SECONDS`).
    pub handshake_timeout: Duration,
    /// What protects the data of the TCP connections (`TORCHCOMMS_DATA_PROTECTION`).
    pub protection: Protection,
    /// Use shared memory between ranks of one host (`CTRAN_BACKENDS` contains `shm`).
    pub use_shm: bool,
    /// Use the NVLink transport for GPU buffers when every rank's GPU reaches every other's.
    pub use_nvl: bool,
    /// `CTRAN_BACKENDS` names `ib`: peers that shared memory does not reach go through ib
    /// where both ranks open it (otherwise socket; the log says why).
    pub want_ib: bool,
    /// What ib runs on (`CTRAN_IB_PROVIDER`).
    pub ib_provider: crate::transport::ib::IbProvider,
    /// The smallest GPU send or receive moved in place over ib (`CTRAN_IB_GPU_DIRECT` and
    /// `CTRAN_IB_GPU_DIRECT_MIN_BYTES`); `None`: every one stages.
    pub ib_gpu_direct_min_bytes: Option<usize>,
    /// The NVLink transport's settings.
    pub nvl: crate::nvl::NvlConfig,
    /// Shared-memory transport settings.
    pub shm: ShmConfig,
    /// How long a waiting caller and an idle progress thread spin before they sleep
    /// (`CTRAN_WAIT_SPIN_US`); `None` decides at creation from the cores per local rank.
    pub wait_spin: Option<Duration>,
    /// Abort the whole process when an operation fails or times out (torchcomms'
    /// `abort_process_on_timeout_or_error`), like NCCL's watchdog does.
    pub abort_process_on_error: bool,
    /// Algorithm per collective (`CTRAN_<COLLECTIVE>_ALGO`) and cost-model parameters
    /// (`CTRAN_COST_*`); see [`crate::algos::select`].
    pub algos: AlgoConfig,
    /// colltrace settings (`TORCHCOMMS_TRACE_*`).
    pub trace: colltrace::TraceConfig,
}

impl CommConfig {
    /// A configuration for `rank` of `size` named `name`, with defaults from the cvars
    /// (`docs/cvars.md`: defaults, the `TORCHCOMMS_CONFIG` file, the environment; reloaded by
    /// every call): `TORCHCOMM_TIMEOUT_SECONDS`, `CTRAN_CHUNK_BYTES`, `CTRAN_SOCKET_*`,
    /// `CTRAN_BACKENDS`, `CTRAN_SHM_*`, `CTRAN_<COLLECTIVE>_ALGO`, `CTRAN_COST_*` and the
    /// `TORCHCOMMS_TRACE_*` settings. An invalid value is an [`Error::InvalidArgument`] naming
    /// the variable, the value and what is allowed.
    pub fn from_env(name: impl Into<String>, rank: usize, size: usize) -> Result<CommConfig> {
        let name = name.into();
        if size == 0 {
            return Err(Error::invalid("size", "at least 1 rank", size));
        }
        if rank >= size {
            return Err(Error::invalid(
                "rank",
                format!("a rank in [0, {size})"),
                rank,
            ));
        }
        if name.is_empty() || name.contains('/') {
            return Err(Error::invalid(
                "name",
                "a non-empty communicator name without '/'",
                &name,
            ));
        }
        let cv = torchcomms_cvars::reload().map_err(super::trace::cvar_error)?;
        let socket = SocketConfig {
            ifaddr: cv.ctran_socket_ifaddr(),
            spin: cv.ctran_socket_spin_us(),
            buf_bytes: cv.ctran_socket_buf_bytes(),
        };
        let shm = ShmConfig {
            coll_bytes: cv.ctran_shm_buffer_bytes(),
            spin: cv.ctran_shm_spin_us(),
            cma: cv.ctran_shm_cma(),
            cma_min_bytes: cv.ctran_shm_cma_min_bytes(),
            lanes: match cv.ctran_shm_lanes() {
                0 => None,
                n => Some(n as usize),
            },
            lanes_min_bytes: cv.ctran_shm_lanes_min_bytes(),
            ..ShmConfig::default()
        };
        let mut algos = AlgoConfig::default();
        for c in Collective::ALL {
            if let Some(e) = cv.entry(c.env_var()) {
                algos.set(c, Choice::parse(c, &e.value, c.env_var())?);
            }
        }
        algos.cost = CostOverrides {
            alpha_us: cv.ctran_cost_alpha_us(),
            mu_us: cv.ctran_cost_mu_us(),
            beta_gbps: cv.ctran_cost_beta_gbps(),
            gamma_gbps: cv.ctran_cost_gamma_gbps(),
        };
        Ok(CommConfig {
            name,
            dedicated_store: false,
            rank,
            size,
            timeout: cv.torchcomm_timeout_seconds(),
            chunk_bytes: cv.ctran_chunk_bytes(),
            gpe_chunk_bytes: cv.ctran_gpe_chunk_bytes(),
            gpe_staging_bytes: cv.ctran_gpe_staging_bytes(),
            socket,
            handshake_timeout: cv.torchcomms_handshake_timeout_seconds(),
            protection: {
                let mode = cv.torchcomms_data_protection();
                Protection::parse(mode).ok_or_else(|| {
                    Error::invalid(Protection::CVAR, "none, integrity or encrypt", mode)
                })?
            },
            use_shm: cv.ctran_backends().contains(&"shm"),
            use_nvl: cv.ctran_backends().contains(&"nvl"),
            want_ib: cv.ctran_backends().contains(&"ib"),
            ib_provider: crate::transport::ib::IbProvider::parse(cv.ctran_ib_provider())
                .ok_or_else(|| {
                    Error::invalid("CTRAN_IB_PROVIDER", "verbs or soft", cv.ctran_ib_provider())
                })?,
            ib_gpu_direct_min_bytes: cv
                .ctran_ib_gpu_direct()
                .then(|| cv.ctran_ib_gpu_direct_min_bytes()),
            nvl: crate::nvl::NvlConfig {
                staged_max_bytes: cv.ctran_nvl_staged_max_bytes(),
                ll_max_bytes: cv.ctran_nvl_ll_max_bytes(),
                p2p_slot_bytes: cv.ctran_nvl_p2p_slot_bytes(),
                p2p_slots: usize::try_from(cv.ctran_nvl_p2p_slots())
                    .unwrap_or(1)
                    .max(1),
                blocks: usize::try_from(cv.ctran_nvl_blocks()).unwrap_or(0),
                mode: cv.ctran_nvl_algo().to_string(),
                budget_bytes: cv.ctran_nvl_budget_bytes(),
                pipe_bytes: cv.ctran_nvl_pipe_bytes(),
                pipe_chunk_bytes: cv.ctran_nvl_pipe_chunk_bytes(),
                pipe_min_bytes: cv.ctran_nvl_pipe_min_bytes(),
                pipe_bcast_min_bytes: cv.ctran_nvl_pipe_bcast_min_bytes(),
            },
            shm,
            wait_spin: cv.ctran_wait_spin_us(),
            abort_process_on_error: false,
            algos,
            trace: colltrace::TraceConfig::from_cvars(&cv),
        })
    }
}
