//! What a guard does with a request it judges: the one setting every layer reads (the
//! configuration, the rollout's resource, the guards, the renderings, the service).

use serde::{Deserialize, Serialize};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deny with a clear message.
    #[default]
    Enforce,
    /// Allow, with a warning and an audit annotation.
    Warn,
    /// Not installed in the hosted cluster.
    Off,
}
