//! Typed custom resources the agent reads and writes, and the CRD manifests the local control
//! plane installs for them.
//!
//! HyperShift's and ACM's CRD manifests are hand-written (not derived from these structs)
//! because they must match what HyperShift and ACM ship, not what serde would infer;
//! `e2e/testbed.rs` proves the typed structs read and write objects that the served schemas
//! accept. The agent's own CRDs (`health`, `rollout`) are derived from their structs.

pub mod admission_rollout;
pub mod conditions;
pub mod health;
pub mod hostedcluster;
pub mod hostedcontrolplane;
pub mod policy;
pub mod reference;

pub use conditions::{Condition, ConditionStatus};
pub use health::{
    AdmissionHealth, AdmissionHealthPolicy, AdmissionHealthPolicySpec, AdmissionHealthPolicyStatus,
    AdmissionHealthSpec, AdmissionHealthStatus, ConcernStatus, GuardPath, HistoryEntry,
};
pub use hostedcluster::HostedCluster;
pub use hostedcontrolplane::{HostedControlPlane, HostedControlPlaneStatus, SecretKeyRef};
pub use policy::{
    ClusterCompliance, ComplianceHistory, ComplianceState, Policy, PolicySpec, PolicyStatus,
    PolicyTemplate, TemplateDetails,
};

/// The label HyperShift puts on every hosted control plane namespace.
pub const HCP_NAMESPACE_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";

/// OpenShift CRDs the hosted clusters of the test bed serve, so the webhooks see real objects.
pub const HOSTED_CRD_MANIFESTS: &[(&str, &str)] = &[
    (
        "featuregates.config.openshift.io",
        include_str!("featuregates.yaml"),
    ),
    (
        "securitycontextconstraints.security.openshift.io",
        include_str!("securitycontextconstraints.yaml"),
    ),
    (
        "ingresses.config.openshift.io",
        include_str!("ingresses.config.openshift.io.yaml"),
    ),
    (
        "upgradeconfigs.upgrade.managed.openshift.io",
        include_str!("upgradeconfigs.upgrade.managed.openshift.io.yaml"),
    ),
    (
        "networks.operator.openshift.io",
        include_str!("networks.operator.openshift.io.yaml"),
    ),
    (
        "groups.user.openshift.io",
        include_str!("groups.user.openshift.io.yaml"),
    ),
    (
        "configs.imageregistry.operator.openshift.io",
        include_str!("configs.imageregistry.operator.openshift.io.yaml"),
    ),
    (
        "clusterversions.config.openshift.io",
        include_str!("clusterversions.config.openshift.io.yaml"),
    ),
    (
        "imagestreams.image.openshift.io",
        include_str!("imagestreams.image.openshift.io.yaml"),
    ),
];

/// The CRD manifests of the types above (YAML), in install order.
pub const CRD_MANIFESTS: &[(&str, &str)] = &[
    (
        "hostedcontrolplanes.hypershift.openshift.io",
        include_str!("hostedcontrolplanes.yaml"),
    ),
    (
        "policies.policy.open-cluster-management.io",
        include_str!("policies.yaml"),
    ),
    (
        "hostedclusters.hypershift.openshift.io",
        include_str!("hostedclusters.yaml"),
    ),
];
