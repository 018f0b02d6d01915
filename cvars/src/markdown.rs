//! The Markdown reference of every cvar (`docs/cvars.md`).

use crate::{Kind, SPECS};

/// The reference of every cvar as Markdown: what `docs/cvars.md` holds.
pub fn markdown() -> String {
    let mut s = String::from(
        "# Configuration variables (cvars)\n\n\
         <!-- Generated from cvars/cvars.toml by `CVARS_UPDATE_DOCS=1 cargo test -p torchcomms-cvars`. \
         Do not edit by hand. -->\n\n\
         Every tunable of torchcomms-rs, declared once in `cvars/cvars.toml`. Values come, lowest \
         precedence first, from the default below, the configuration file named by \
         `TORCHCOMMS_CONFIG` (TOML or YAML; keys are the variable names, lists may be arrays), \
         and the environment. An empty environment variable counts as unset. An invalid value \
         fails communicator creation with an error naming the variable, the value, where it \
         came from and what is allowed. `torchcomms-perf --print-cvars` prints the effective \
         value of each and its source.\n\n\
         Launcher variables (`TORCHCOMM_RANK`, `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, \
         `MASTER_PORT`, `OMPI_*`, `PMI_*`, `PALS_*`, `SLURM_*`, `TORCHELASTIC_USE_AGENT_STORE`) \
         describe the job rather than tune it and are read by the bootstrap layer directly.\n\n\
         Example `torchcomms.toml`:\n\n\
         ```toml\n\
         CTRAN_CHUNK_BYTES = \"4M\"\n\
         CTRAN_BACKENDS = [\"socket\", \"shm\"]\n\
         TORCHCOMMS_TRACE_DIR = \"/var/tmp/traces\"\n\
         TORCHCOMMS_TRACE_BUFFER_SIZE = 5000\n\
         ```\n\n\
         | Name | Type | Default | Allowed | Owner | Description |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for spec in SPECS {
        let ty = match spec.kind {
            Kind::Duration => format!("duration ({})", spec.unit.suffix()),
            k => k.name().to_string(),
        };
        let default = match spec.default {
            Some("") => "(empty)".to_string(),
            Some(d) => format!("`{d}`"),
            None => "(unset)".to_string(),
        };
        let allowed = match spec.kind {
            Kind::String => String::new(),
            _ => spec.expected().replace('|', "\\|"),
        };
        s.push_str(&format!(
            "| `{}` | {ty} | {default} | {allowed} | {} | {} |\n",
            spec.name,
            spec.owner,
            spec.doc.replace('|', "\\|")
        ));
    }
    s
}
