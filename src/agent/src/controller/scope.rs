//! One HCP as a reconcile carries it through the phases: who it is (the HCP, its namespace and
//! hosted cluster), what it runs (the configuration and revision the rollout and its override
//! resolved) and the agent's shared context (the management client, caches, metrics). Every
//! phase takes one, so a phase's arguments are only what that phase adds, and no phase can be
//! handed one HCP's namespace with another's cluster name.

use super::context::{Context, hcp_labels};
use crate::metrics::HcpLabels;
use hcp_fleet_model::crd::HostedControlPlane;
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::overrides::Resolved;

pub(crate) struct Scope<'a> {
    pub(crate) ctx: &'a Context,
    pub(crate) hcp: &'a HostedControlPlane,
    /// The HCP namespace: the key of the HCP's state, and in every message and span.
    pub(crate) ns: &'a str,
    /// The hosted cluster (HyperShift names the HCP after its HostedCluster).
    pub(crate) cluster: &'a str,
    /// The configuration this HCP runs: the rollout's revision, its override applied.
    pub(crate) cfg: &'a AgentConfig,
    pub(crate) revision: &'a str,
}

impl<'a> Scope<'a> {
    pub(crate) fn new(
        ctx: &'a Context,
        hcp: &'a HostedControlPlane,
        ns: &'a str,
        cluster: &'a str,
        resolved: &'a Resolved,
    ) -> Self {
        Scope {
            ctx,
            hcp,
            ns,
            cluster,
            cfg: &resolved.config,
            revision: &resolved.revision,
        }
    }

    /// The metric labels of this hosted cluster.
    pub(crate) fn labels(&self) -> HcpLabels {
        hcp_labels(self.ns, self.cluster)
    }
}
