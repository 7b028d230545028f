//! HyperShift's HostedCluster, read for its metadata only: the agent needs the annotation ACM
//! puts on it (the name of its managed cluster), never its spec. The spec is kept whole
//! (`extra`) for the test bed's fixtures, which create HostedClusters as HyperShift would.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "hypershift.openshift.io",
    version = "v1beta1",
    kind = "HostedCluster",
    plural = "hostedclusters",
    namespaced,
    schema = "disabled"
)]
pub struct HostedClusterSpec {
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}
