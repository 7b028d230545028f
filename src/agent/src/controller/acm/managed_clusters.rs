//! Which HCP an ACM managed cluster is. With hosted-mode addons, ACM's framework addon for
//! hosted cluster X runs on the management cluster in `klusterlet-X` and creates the agent's
//! template there; the agent must find the one HCP that X is before it reports X's row.
//!
//! ACM names the managed cluster of a HostedCluster in one of three ways, tried in this order:
//! the HostedCluster's annotation `cluster.open-cluster-management.io/managedcluster-name`
//! (set when it is imported), the HostedCluster's own name, or, for clusters ACM discovered,
//! `<prefix>-<name>` (`reporting.discoveryPrefix`). HyperShift puts the HCP of HostedCluster
//! `<ns>/<name>` in namespace `<ns>-<name>`. Where `klusterlet-X/external-managed-kubeconfig`
//! exists (the credentials ACM's klusterlet uses for X), the kube-apiserver it names must be the
//! one in that namespace: a mapping the klusterlet's own credentials contradict is reported,
//! never guessed past. Everything here is read from management-cluster objects that the hosted
//! cluster's admins cannot write.

use std::collections::BTreeMap;

use serde::Deserialize;

/// ACM's annotation on a HostedCluster: the name of its managed cluster.
pub const MANAGED_CLUSTER_ANNOTATION: &str =
    "cluster.open-cluster-management.io/managedcluster-name";

/// The Secret in `klusterlet-X` with which ACM's hosted-mode klusterlet reaches X.
pub const EXTERNAL_KUBECONFIG: &str = "external-managed-kubeconfig";

/// The namespace of the hosted-mode addons for managed cluster X.
pub(crate) const KLUSTERLET_PREFIX: &str = "klusterlet-";

/// A HostedCluster, as far as the mapping reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostedClusterRef {
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The managed-cluster annotation, if set.
    pub(crate) managed_cluster: Option<String>,
}

impl HostedClusterRef {
    /// The namespace HyperShift gives this HostedCluster's control plane.
    pub(crate) fn hcp_namespace(&self) -> String {
        format!("{}-{}", self.namespace, self.name)
    }

    /// The HostedClusters the agent can infer from its HCPs where the HostedCluster API is not
    /// served here (an HCP is named after its HostedCluster, in `<ns>-<name>`).
    pub(crate) fn from_hcp(hcp_namespace: &str, name: &str) -> Option<Self> {
        let namespace = hcp_namespace.strip_suffix(&format!("-{name}"))?;
        (!namespace.is_empty()).then(|| Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
            managed_cluster: None,
        })
    }
}

/// What `klusterlet-X/external-managed-kubeconfig` says about X's API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KlusterletServer {
    /// No such Secret: nothing to check against.
    Absent,
    /// Its server is the kube-apiserver Service of this HCP namespace.
    Namespace(String),
    /// It names no HCP's kube-apiserver Service, or cannot be read: the reason.
    Unusable(String),
}

/// Why managed cluster `x` maps to no HCP namespace: what its template's status says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unmapped {
    #[error(
        "managed cluster {x} is {how} {} HostedClusters ({}); none is reported for it",
        .found.len(),
        .found.join(", ")
    )]
    Ambiguous {
        x: String,
        how: String,
        /// `namespace/name` of each.
        found: Vec<String>,
    },
    #[error(
        "no HostedCluster on this management cluster is managed cluster {x} (by its {MANAGED_CLUSTER_ANNOTATION} annotation, its name{})",
        .discovery_name.as_ref().map_or(String::new(), |n| format!(", or its discovery name for {n}"))
    )]
    NotFound {
        x: String,
        discovery_name: Option<String>,
    },
    #[error(
        "managed cluster {x} maps to {found}, but {KLUSTERLET_PREFIX}{x}/{EXTERNAL_KUBECONFIG} reaches the kube-apiserver in {reached}; not reported until they agree"
    )]
    Disagrees {
        x: String,
        found: String,
        reached: String,
    },
    #[error(
        "managed cluster {x} maps to {found}, but {KLUSTERLET_PREFIX}{x}/{EXTERNAL_KUBECONFIG} cannot confirm it: {why}"
    )]
    Unconfirmed {
        x: String,
        found: String,
        why: String,
    },
}

/// The HCP namespace managed cluster `x` is, or why there is none. `hosted` lists every
/// HostedCluster on the management cluster.
pub(crate) fn resolve(
    x: &str,
    hosted: &[HostedClusterRef],
    prefix: Option<&str>,
    server: &KlusterletServer,
) -> Result<String, Unmapped> {
    let one = |found: Vec<&HostedClusterRef>, how: &str| -> Option<Result<String, Unmapped>> {
        match found.as_slice() {
            [] => None,
            [h] => Some(Ok(h.hcp_namespace())),
            many => Some(Err(Unmapped::Ambiguous {
                x: x.to_string(),
                how: how.to_string(),
                found: many
                    .iter()
                    .map(|h| format!("{}/{}", h.namespace, h.name))
                    .collect(),
            })),
        }
    };
    // A HostedCluster annotated with another name is that other managed cluster, never X.
    let unclaimed = |name: &str| -> Vec<&HostedClusterRef> {
        hosted
            .iter()
            .filter(|h| h.name == name && h.managed_cluster.as_deref().is_none_or(|m| m == x))
            .collect()
    };
    let annotated: Vec<&HostedClusterRef> = hosted
        .iter()
        .filter(|h| h.managed_cluster.as_deref() == Some(x))
        .collect();
    let by_prefix = prefix
        .filter(|p| !p.is_empty())
        .and_then(|p| x.strip_prefix(p)?.strip_prefix('-'))
        .filter(|n| !n.is_empty());
    let found = one(annotated, &format!("the {MANAGED_CLUSTER_ANNOTATION} of"))
        .or_else(|| one(unclaimed(x), "the name of"))
        .or_else(|| {
            by_prefix.and_then(|n| one(unclaimed(n), "the discovery name (prefix and name) of"))
        })
        .unwrap_or_else(|| {
            Err(Unmapped::NotFound {
                x: x.to_string(),
                discovery_name: by_prefix.map(str::to_string),
            })
        })?;
    match server {
        KlusterletServer::Absent => Ok(found),
        KlusterletServer::Namespace(ns) if *ns == found => Ok(found),
        KlusterletServer::Namespace(ns) => Err(Unmapped::Disagrees {
            x: x.to_string(),
            found,
            reached: ns.clone(),
        }),
        KlusterletServer::Unusable(why) => Err(Unmapped::Unconfirmed {
            x: x.to_string(),
            found,
            why: why.clone(),
        }),
    }
}

#[derive(Deserialize)]
struct Named<T> {
    #[serde(default)]
    name: String,
    #[serde(flatten)]
    inner: T,
}

#[derive(Deserialize)]
struct ClusterEntry {
    cluster: ClusterFields,
}

#[derive(Deserialize)]
struct ClusterFields {
    #[serde(default)]
    server: String,
}

#[derive(Deserialize)]
struct ContextEntry {
    context: ContextFields,
}

#[derive(Deserialize)]
struct ContextFields {
    #[serde(default)]
    cluster: String,
}

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    contexts: Vec<Named<ContextEntry>>,
    #[serde(rename = "current-context", default)]
    current_context: String,
}

/// The most of a klusterlet kubeconfig read (the same bound as a hosted one).
const MAX_KUBECONFIG_BYTES: usize = crate::hosted::kubeconfig::MAX_KUBECONFIG_BYTES;

/// What a klusterlet kubeconfig's server says: the HCP namespace of its kube-apiserver
/// Service host (`<service>.<namespace>.svc[.cluster.local]`, as ACM's hypershift addon writes
/// it). Errors never quote the document (it holds credentials).
pub(crate) fn klusterlet_server(raw: &[u8]) -> KlusterletServer {
    match server_of(raw) {
        Ok(server) => match service_namespace(&server) {
            Some(ns) => KlusterletServer::Namespace(ns),
            None => KlusterletServer::Unusable(format!(
                "its server {} is not a kube-apiserver Service of an HCP namespace",
                hcp_fleet_render::reporting::cut(&server, 120)
            )),
        },
        Err(why) => KlusterletServer::Unusable(why.into()),
    }
}

fn server_of(raw: &[u8]) -> Result<String, &'static str> {
    if raw.len() > MAX_KUBECONFIG_BYTES {
        return Err("its kubeconfig is over the size limit");
    }
    let text = std::str::from_utf8(raw).map_err(|_| "its kubeconfig is not UTF-8")?;
    let kc: Kubeconfig =
        serde_saphyr::from_str(text).map_err(|_| "its kubeconfig is not a valid kubeconfig")?;
    let cluster = if kc.current_context.is_empty() && kc.contexts.len() <= 1 {
        kc.contexts.first().map(|c| c.inner.context.cluster.clone())
    } else {
        kc.contexts
            .iter()
            .find(|c| c.name == kc.current_context)
            .map(|c| c.inner.context.cluster.clone())
    };
    let server = match cluster {
        Some(name) => kc.clusters.iter().find(|c| c.name == name),
        None if kc.clusters.len() == 1 => kc.clusters.first(),
        None => None,
    }
    .map(|c| c.inner.cluster.server.clone())
    .filter(|s| !s.is_empty())
    .ok_or("its kubeconfig names no server")?;
    Ok(server)
}

/// `<namespace>` of `https://<service>.<namespace>.svc[.cluster.local][:port][/path]`, read
/// as a hosted server is (`hosted::kubeconfig::parse_server`: user information, a query or a
/// fragment names no Service).
fn service_namespace(server: &str) -> Option<String> {
    let url = crate::hosted::kubeconfig::parse_server(server).ok()?;
    let host = url.host.strip_suffix(".cluster.local").unwrap_or(&url.host);
    match host.split('.').collect::<Vec<_>>().as_slice() {
        [svc, ns, "svc"] if !svc.is_empty() && !ns.is_empty() => Some((*ns).to_string()),
        _ => None,
    }
}

/// The HostedClusters behind the agent's HCPs (HCP namespace to HostedCluster name), for
/// management clusters that do not serve the HostedCluster API to the agent.
pub(crate) fn inferred(hcps: &BTreeMap<String, String>) -> Vec<HostedClusterRef> {
    hcps.iter()
        .filter_map(|(ns, name)| HostedClusterRef::from_hcp(ns, name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hc(ns: &str, name: &str, annotation: Option<&str>) -> HostedClusterRef {
        HostedClusterRef {
            namespace: ns.into(),
            name: name.into(),
            managed_cluster: annotation.map(str::to_string),
        }
    }

    /// Every way ACM names a managed cluster, in ACM's order, and every way a mapping is
    /// refused.
    #[test]
    fn a_managed_cluster_maps_to_one_hcp_or_says_why_not() {
        let fleet = [
            hc("clusters", "alpha", Some("prod-alpha")),
            hc("clusters", "beta", None),
            hc("clusters", "gamma", None),
            hc("other", "gamma", None),
            hc("clusters", "delta", Some("shared")),
            hc("other", "delta", Some("shared")),
            // Named like another cluster's managed name, annotated as itself.
            hc("clusters", "prod-alpha", Some("prod-alpha-2")),
        ];
        let absent = KlusterletServer::Absent;
        // (managed cluster, discovery prefix, the klusterlet's kubeconfig, HCP or why not)
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            &'a KlusterletServer,
            Result<&'a str, &'a str>,
        );
        let cases: &[Case] = &[
            // The annotation wins over a HostedCluster of that name.
            ("prod-alpha", None, &absent, Ok("clusters-alpha")),
            // Annotated with another name: not "alpha" any more.
            ("alpha", None, &absent, Err("no HostedCluster")),
            ("beta", None, &absent, Ok("clusters-beta")),
            ("mgmt-beta", Some("mgmt"), &absent, Ok("clusters-beta")),
            ("mgmt-beta", None, &absent, Err("no HostedCluster")),
            ("mgmt-", Some("mgmt"), &absent, Err("no HostedCluster")),
            ("gamma", None, &absent, Err("the name of 2 HostedClusters")),
            (
                "shared",
                None,
                &absent,
                Err("managedcluster-name of 2 HostedClusters"),
            ),
            ("prod-alpha-2", None, &absent, Ok("clusters-prod-alpha")),
            (
                "beta",
                None,
                &KlusterletServer::Namespace("clusters-beta".into()),
                Ok("clusters-beta"),
            ),
            (
                "beta",
                None,
                &KlusterletServer::Namespace("clusters-alpha".into()),
                Err("reaches the kube-apiserver in clusters-alpha"),
            ),
            (
                "beta",
                None,
                &KlusterletServer::Unusable("no server".into()),
                Err("cannot confirm it: no server"),
            ),
        ];
        for (x, prefix, server, want) in cases {
            let got = resolve(x, &fleet, *prefix, server);
            match (want, &got) {
                (Ok(ns), Ok(g)) => assert_eq!(g, ns, "{x}"),
                (Err(needle), Err(g)) => assert!(g.to_string().contains(needle), "{x}: {g}"),
                _ => panic!("{x}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn the_klusterlet_kubeconfig_names_the_hcp_namespace() {
        let kc = |server: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    token: s3cr3t-token\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
            )
        };
        let ok = |s: &str| klusterlet_server(kc(s).as_bytes());
        assert_eq!(
            ok("https://kube-apiserver.clusters-a.svc:6443"),
            KlusterletServer::Namespace("clusters-a".into())
        );
        assert_eq!(
            ok("https://kube-apiserver.clusters-a.svc.cluster.local:6443/"),
            KlusterletServer::Namespace("clusters-a".into())
        );
        for bad in [
            "https://api.example.com:6443",
            "https://kube-apiserver:6443",
            "https://kube-apiserver.clusters-a.svc:6443@10.0.0.5:443",
            "https://x@kube-apiserver.clusters-a.svc:6443",
            "http://kube-apiserver.clusters-a.svc:6443",
        ] {
            assert!(
                matches!(ok(bad), KlusterletServer::Unusable(_)),
                "{bad}: {:?}",
                ok(bad)
            );
        }
        // Malformed documents say so without quoting them.
        for raw in [
            &b"clusters: [token: s3cr3t-token"[..],
            b"\xff\xfe",
            b"apiVersion: v1\nusers:\n- name: u\n  user:\n    token: s3cr3t-token\n",
        ] {
            match klusterlet_server(raw) {
                KlusterletServer::Unusable(why) => assert!(!why.contains("s3cr3t"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn hostedclusters_are_inferred_from_hcps() {
        let hcps = BTreeMap::from([
            ("clusters-a".to_string(), "a".to_string()),
            ("odd".to_string(), "b".to_string()),
        ]);
        assert_eq!(inferred(&hcps), [hc("clusters", "a", None)]);
    }
}
