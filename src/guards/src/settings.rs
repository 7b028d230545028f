//! The guards' input: what the configuration says about them, in the one shape every engine
//! reads (the admission service's decision, the CEL forms, the canaries).

use serde::{Deserialize, Serialize};

use hcp_fleet_model::Mode;

/// The environment variable that carries `Settings` (JSON) into the admission service.
pub const SETTINGS_ENV: &str = "HCP_FLEET_WEBHOOK_SETTINGS";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookSetting {
    pub name: String,
    pub path: String,
    pub mode: Mode,
    /// Whom this guard leaves alone: its identity classes' members, its own additions and the
    /// configuration's every-guard exemptions, resolved (exact names, or prefixes ending in
    /// '*'; groups exact).
    #[serde(default)]
    pub exempt_users: Vec<String>,
    #[serde(default)]
    pub exempt_groups: Vec<String>,
}

/// What the guards decide with: the configured webhooks' modes, whom the configuration exempts
/// and what it protects. The agent makes it from its configuration (`From<&AgentConfig>`, in
/// `config`, which sits above the guards) and renders it into the admission service's
/// Deployment (`SETTINGS_ENV`, JSON), so a change rolls out like any other
/// Deployment change; the hosted policies' CEL and the canaries are made from the same value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub webhooks: Vec<HookSetting>,
    /// Every identity some guard exempts (the union of the hooks' own lists): what the identity
    /// guards keep a tenant from minting. Exact user names, or prefixes ending in '*'.
    pub exempt_users: Vec<String>,
    pub exempt_groups: Vec<String>,
    /// Namespaces under a reserved prefix that a customer may create and use (Red Hat's layered
    /// products): their service accounts are nobody's by a prefix, and the names are not
    /// reserved (`identities::user_matches`).
    #[serde(default)]
    pub customer_namespaces: Vec<String>,
    /// Who is in each identity class: what a denial is counted by (`identities::sender_of`).
    #[serde(default)]
    pub classes: Vec<ClassSetting>,
    /// Exact names, or prefixes ending in '*'.
    pub protected_cluster_roles: Vec<String>,
    /// Namespaces (or prefixes ending in '*') whose requests the webhooks never judge.
    pub exempt_namespaces: Vec<String>,
    pub service_annotation_key: String,
    pub service_annotation_value: String,
    /// The hosted cluster's internal registry as the agent last wrote it
    /// (`pod_image_spec::InternalRegistry`): never in the configuration, read by the admission
    /// service from the file the agent's ConfigMap is mounted as; `None` until it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_registry: Option<crate::pod_image_spec::InternalRegistry>,
}

/// The members of one identity class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassSetting {
    pub class: crate::identities::IdentityClass,
    pub users: Vec<String>,
    pub groups: Vec<String>,
}

impl Settings {
    pub fn hook(&self, path: &str) -> Option<&HookSetting> {
        self.webhooks.iter().find(|w| w.path == path)
    }

    /// Some guard exempts `user` (with `groups`): an identity a tenant must not reach.
    pub fn exempts_anywhere(&self, user: &str, groups: &[impl AsRef<str>]) -> bool {
        crate::identities::is_member(
            &self.exempt_users,
            &self.exempt_groups,
            user,
            groups,
            &self.customer_namespaces,
        )
    }
}
