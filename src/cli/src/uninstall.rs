//! `uninstall`: removes what the agent put into the fleet, after the agent itself is gone.
//!
//! Order matters for the hosted clusters: their webhook configurations go first, and only once
//! they are gone does the admission service they call go. A hosted cluster that cannot be
//! reached keeps its webhooks and its admission service (a webhook with `failurePolicy: Fail`
//! pointing at nothing would block its users), is reported, and makes the command fail, so it
//! can be run again.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};

use hcp_fleet_agent::hosted::clients::HostedClient;
use hcp_fleet_model::crd::{AdmissionHealth, HostedControlPlane};
use hcp_fleet_model::names::LEASE_NAME;
use hcp_fleet_render::config::{AgentConfig, MonitoringApi};
use hcp_fleet_render::hosted::webhooks;
use hcp_fleet_render::management;
use hcp_fleet_render::management::PdbApi;
use hcp_fleet_render::reporting;

#[derive(Debug, clap::Args)]
pub(crate) struct UninstallArgs {
    /// The agent's configuration file (names of the objects to remove); default: built-in.
    #[arg(long, env = "HCP_FLEET_CONFIG")]
    pub(crate) config: Option<std::path::PathBuf>,
    /// The agent's namespace (its Lease).
    #[arg(long, default_value = "hcp-fleet-agent")]
    pub(crate) namespace: String,
    /// Go on even though an agent still holds the leader Lease (it would put everything back).
    #[arg(long)]
    pub(crate) force: bool,
    /// Scale this Deployment (the agent's, in `--namespace`) to zero first and wait until its
    /// leader hands the Lease back: the chart's pre-delete hook stops the agent this way.
    #[arg(long, value_name = "DEPLOYMENT")]
    pub(crate) stop_agent: Option<String>,
    /// How long `--stop-agent` waits for the Lease to be free.
    #[arg(long, default_value_t = 120)]
    pub(crate) stop_timeout_seconds: u64,
}

/// What happened in one HCP namespace.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Removed {
    pub(crate) hosted_objects: usize,
    pub(crate) management_objects: usize,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum UninstallError {
    #[error("{namespace}: hosted cluster: {reason}; its webhooks and admission service are kept")]
    Hosted { namespace: String, reason: String },
    #[error("{namespace}: deleting {what}: {source}")]
    Delete {
        namespace: String,
        what: String,
        source: kube::Error,
    },
}

/// Whether `lease` is held by someone, renewed within its duration, at `now`.
pub(crate) fn lease_is_held(lease: &Lease, now: jiff::Timestamp) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds?));
    (renewed + duration > now).then_some(holder)
}

async fn delete_named<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the agent's webhook configurations, admission policies and bindings, and the
/// canaries' RBAC, in one hosted cluster, by the names the agent gives them: never by its
/// label, which any tenant can put on objects of their own.
async fn remove_hosted(hosted: &Client, cfg: &AgentConfig) -> Result<usize, kube::Error> {
    let mut n = 0;
    let vapi: Api<ValidatingWebhookConfiguration> = Api::all(hosted.clone());
    n += usize::from(delete_named(&vapi, webhooks::VALIDATING_NAME).await?);
    let mapi: Api<MutatingWebhookConfiguration> = Api::all(hosted.clone());
    n += usize::from(delete_named(&mapi, webhooks::MUTATING_NAME).await?);
    // Bindings before their policies; a server without admission policies answers 404, as for
    // an object that is not there.
    let names = hcp_fleet_render::hosted::admission_policies::names_ours(&cfg.webhooks);
    let bapi: Api<ValidatingAdmissionPolicyBinding> = Api::all(hosted.clone());
    let papi: Api<ValidatingAdmissionPolicy> = Api::all(hosted.clone());
    for name in &names {
        n += usize::from(delete_named(&bapi, name).await?);
    }
    for name in &names {
        n += usize::from(delete_named(&papi, name).await?);
    }
    // The mutating ones likewise (Kubernetes 1.36; 404 elsewhere).
    use hcp_fleet_render::hosted::admission_policies::{
        mutating_binding_resource, mutating_resource,
    };
    let mbapi: Api<kube::api::DynamicObject> =
        Api::all_with(hosted.clone(), &mutating_binding_resource());
    let mpapi: Api<kube::api::DynamicObject> = Api::all_with(hosted.clone(), &mutating_resource());
    for name in &names {
        n += usize::from(delete_named(&mbapi, name).await?);
    }
    for name in &names {
        n += usize::from(delete_named(&mpapi, name).await?);
    }
    // The canaries' RBAC (`hosted::canary`), once the guards it served are gone; not counted
    // (it exists only once a canary has run, and the count names the guards' objects).
    let rbapi: Api<ClusterRoleBinding> = Api::all(hosted.clone());
    delete_named(&rbapi, hcp_fleet_render::hosted::canary::RBAC_NAME).await?;
    let rapi: Api<ClusterRole> = Api::all(hosted.clone());
    delete_named(&rapi, hcp_fleet_render::hosted::canary::RBAC_NAME).await?;
    Ok(n)
}

/// One HCP namespace: hosted webhooks first, then the management-side objects.
async fn remove_hcp(
    client: &Client,
    cfg: &AgentConfig,
    ns: &str,
    cluster: &str,
) -> Result<Removed, UninstallError> {
    let hosted_err = |reason: String| UninstallError::Hosted {
        namespace: ns.to_string(),
        reason,
    };
    let access = &cfg.hosted_access;
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(&access.kubeconfig_secret)
        .await
        .map_err(|e| {
            hosted_err(format!(
                "reading {}: {}",
                access.kubeconfig_secret,
                hcp_fleet_agent::human::KubeError(&e)
            ))
        })?
        .ok_or_else(|| hosted_err(format!("secret {} not found", access.kubeconfig_secret)))?;
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&access.kubeconfig_key))
        .map(|b| b.0.clone())
        .ok_or_else(|| hosted_err(format!("secret has no key {}", access.kubeconfig_key)))?;
    let built = HostedClient::build(
        ns,
        &access.kubeconfig_secret,
        &raw,
        access,
        Default::default(),
    )
    .await
    .map_err(|e| hosted_err(e.to_string()))?;
    let (hosted, server) = (built.client(), built.server);
    let timeout = access.request_timeout() * 3;
    let hosted_objects = tokio::time::timeout(timeout, remove_hosted(&hosted, cfg))
        .await
        .map_err(|_| hosted_err(format!("{server} did not answer within {timeout:?}")))?
        .map_err(|e| {
            hosted_err(format!(
                "{server}: {}",
                hcp_fleet_agent::human::KubeError(&e)
            ))
        })?;

    let n = remove_management_side(client, cfg, ns, cluster).await?;
    Ok(Removed {
        hosted_objects,
        management_objects: n,
    })
}

/// The admission service's objects in the HCP namespace, and its health record: how many
/// were there.
async fn remove_management_side(
    client: &Client,
    cfg: &AgentConfig,
    ns: &str,
    cluster: &str,
) -> Result<usize, UninstallError> {
    let del = |what: String| {
        move |source| UninstallError::Delete {
            namespace: ns.to_string(),
            what,
            source,
        }
    };
    let svc = &cfg.admission.service_name;
    let mut n = 0;
    let c = || client.clone();
    n += usize::from(
        delete_named(&Api::<Deployment>::namespaced(c(), ns), svc)
            .await
            .map_err(del(format!("Deployment {svc}")))?,
    );
    n += usize::from(
        delete_named(&Api::<Service>::namespaced(c(), ns), svc)
            .await
            .map_err(del(format!("Service {svc}")))?,
    );
    n += usize::from(
        delete_named(&Api::<ServiceAccount>::namespaced(c(), ns), svc)
            .await
            .map_err(del(format!("ServiceAccount {svc}")))?,
    );
    n += usize::from(
        delete_named(&Api::<NetworkPolicy>::namespaced(c(), ns), svc)
            .await
            .map_err(del(format!("NetworkPolicy {svc}")))?,
    );
    // The static guards' files (the hosted kube-apiserver drops them when its kubelet empties
    // the optional volume), and the pod image spec mutation's input.
    for name in [
        hcp_fleet_render::hosted::static_guards::CONFIG_MAP,
        hcp_fleet_render::internal_registry::CONFIG_MAP,
    ] {
        n += usize::from(
            delete_named(
                &Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c(), ns),
                name,
            )
            .await
            .map_err(del(format!("ConfigMap {name}")))?,
        );
    }
    // The agent wrote the PDB as policy/v1 or, on servers without it, policy/v1beta1.
    for pdb in [PdbApi::V1, PdbApi::V1Beta1]
        .map(PdbApi::api_resource)
        .into_iter()
        .flatten()
    {
        // A version the server does not serve answers 404 like a missing object: either way
        // the next version is worth a try.
        let deleted = delete_named(&Api::<DynamicObject>::namespaced_with(c(), ns, &pdb), svc)
            .await
            .map_err(del(format!("PodDisruptionBudget {svc}")))?;
        if deleted {
            n += 1;
            break;
        }
    }
    // The ServiceMonitor in whichever group it was written; a group the server does not serve
    // answers 404, as a missing object does.
    for ar in MonitoringApi::GROUPS
        .map(management::service_monitor_resource)
        .into_iter()
        .flatten()
    {
        n += usize::from(
            delete_named(&Api::<DynamicObject>::namespaced_with(c(), ns, &ar), svc)
                .await
                .map_err(del(format!("ServiceMonitor {svc} ({})", ar.group)))?,
        );
    }
    let rb = management::prometheus_binding_name(cfg);
    n += usize::from(
        delete_named(&Api::<RoleBinding>::namespaced(c(), ns), &rb)
            .await
            .map_err(del(format!("RoleBinding {rb}")))?,
    );
    for name in [
        management::ca_secret_name(cfg),
        management::tls_secret_name(cfg),
    ] {
        n += usize::from(
            delete_named(&Api::<Secret>::namespaced(c(), ns), &name)
                .await
                .map_err(del(format!("Secret {name}")))?,
        );
    }
    // The record, and an earlier release's under its old name.
    for name in [
        reporting::record::health_name(cluster),
        reporting::record::LEGACY_HEALTH_NAME,
    ] {
        match delete_named(&Api::<AdmissionHealth>::namespaced(c(), ns), name).await {
            Ok(d) => n += usize::from(d),
            // No AdmissionHealth CRD: nothing was recorded there.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(del(format!("AdmissionHealth {name}"))(e)),
        }
    }
    Ok(n)
}

/// Removes the agent's objects from every HCP. Returns one line per HCP
/// namespace and whether all succeeded.
pub(crate) async fn uninstall(
    client: &Client,
    cfg: &AgentConfig,
) -> Result<(Vec<String>, bool), kube::Error> {
    let hcps = Api::<HostedControlPlane>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    // HyperShift keeps one HCP per namespace, named after its hosted cluster.
    let mut namespaces: Vec<(String, String)> = hcps
        .iter()
        .filter_map(|h| Some((h.namespace()?, h.name_any())))
        .collect();
    namespaces.sort();
    namespaces.dedup_by(|a, b| a.0 == b.0);
    let results: Vec<(String, Result<Removed, UninstallError>)> = futures::stream::iter(namespaces)
        .map(|(ns, cluster)| async move {
            let r = remove_hcp(client, cfg, &ns, &cluster).await;
            (ns, r)
        })
        .buffer_unordered(usize::from(cfg.concurrency.max(1)))
        .collect()
        .await;
    let mut lines = Vec::new();
    let mut ok = true;
    let mut results = results;
    results.sort_by(|a, b| a.0.cmp(&b.0));
    for (ns, r) in results {
        match r {
            Ok(r) => lines.push(format!(
                "{ns}: removed {} hosted object(s) (webhook configurations, admission policies and bindings) and {} management object(s)",
                r.hosted_objects, r.management_objects
            )),
            Err(e) => {
                ok = false;
                lines.push(format!("error: {e}"));
            }
        }
    }
    Ok((lines, ok))
}

/// Why the agent could not be stopped before the uninstall.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StopError {
    #[error("reading {deployment}: {source}")]
    Read {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error("scaling {deployment} to 0: {source}")]
    Scale {
        deployment: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading the Lease {namespace}/{LEASE_NAME}: {source}")]
    Lease {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "agent {holder} still holds the Lease {namespace}/{LEASE_NAME} after {wait:?} with {deployment} scaled to 0"
    )]
    StillHeld {
        holder: String,
        namespace: String,
        wait: Duration,
        deployment: String,
    },
}

/// Scales the agent's Deployment to zero and waits until no agent holds the Lease (a leader
/// that stops hands it back; one that dies lets it expire). A missing Deployment is an agent
/// already gone. Returns the replicas it had, to restore if the uninstall fails: an agent
/// left at zero would leave every HCP without drift repair, probes or renewals.
async fn stop_agent(
    client: &Client,
    namespace: &str,
    deployment: &str,
    wait: Duration,
) -> Result<Option<i32>, StopError> {
    let at = || format!("{namespace}/{deployment}");
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace);
    let before = match deployments.get_opt(deployment).await {
        Ok(Some(d)) => d.spec.and_then(|s| s.replicas).or(Some(1)),
        Ok(None) => None,
        Err(source) => {
            return Err(StopError::Read {
                deployment: at(),
                source,
            });
        }
    };
    let zero = serde_json::json!({"spec": {"replicas": 0}});
    match deployments
        .patch(deployment, &PatchParams::default(), &Patch::Merge(&zero))
        .await
    {
        Ok(_) => println!("{namespace}/{deployment}: scaled to 0; waiting for the Lease"),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            println!("{namespace}/{deployment}: not found; the agent is already gone")
        }
        Err(source) => {
            return Err(StopError::Scale {
                deployment: at(),
                source,
            });
        }
    }
    let stopped = wait_for_lease(client, namespace, deployment, wait).await;
    if stopped.is_err() {
        restart_agent(client, namespace, deployment, before).await;
    }
    stopped.map(|()| before)
}

/// Puts the agent's Deployment back at `replicas` after a failed uninstall.
async fn restart_agent(client: &Client, namespace: &str, deployment: &str, replicas: Option<i32>) {
    let Some(n) = replicas.filter(|n| *n > 0) else {
        return;
    };
    let back = serde_json::json!({"spec": {"replicas": n}});
    match Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch(deployment, &PatchParams::default(), &Patch::Merge(&back))
        .await
    {
        Ok(_) => println!("{namespace}/{deployment}: the uninstall failed; scaled back to {n}"),
        Err(e) => eprintln!(
            "error: the uninstall failed and {namespace}/{deployment} could not be scaled back to {n}: {e}; scale it up by hand"
        ),
    }
}

async fn wait_for_lease(
    client: &Client,
    namespace: &str,
    deployment: &str,
    wait: Duration,
) -> Result<(), StopError> {
    let leases = Api::<Lease>::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let held = match leases.get_opt(LEASE_NAME).await {
            Ok(l) => l.and_then(|l| lease_is_held(&l, jiff::Timestamp::now())),
            Err(source) => {
                return Err(StopError::Lease {
                    namespace: namespace.to_string(),
                    source,
                });
            }
        };
        let Some(holder) = held else {
            return Ok(());
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(StopError::StillHeld {
                holder,
                namespace: namespace.to_string(),
                wait,
                deployment: deployment.to_string(),
            });
        }
        // The Lease frees by time (renewals stop), not by an event a watch would bring.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

pub(crate) async fn run(args: UninstallArgs) -> ExitCode {
    let cfg = match crate::config_file::load_or_default(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: no management cluster to talk to: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stopped = None;
    if let Some(deployment) = &args.stop_agent {
        let wait = Duration::from_secs(args.stop_timeout_seconds);
        match stop_agent(&client, &args.namespace, deployment, wait).await {
            Ok(before) => stopped = Some((deployment.clone(), before)),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let code = remove_all(&client, &cfg, &args).await;
    if code != ExitCode::SUCCESS
        && let Some((deployment, before)) = stopped
    {
        restart_agent(&client, &args.namespace, &deployment, before).await;
    }
    code
}

/// Everything after the agent is stopped: the Lease checked, then each HCP's webhooks and
/// admission service removed.
async fn remove_all(client: &Client, cfg: &AgentConfig, args: &UninstallArgs) -> ExitCode {
    if !args.force {
        let lease = Api::<Lease>::namespaced(client.clone(), &args.namespace)
            .get_opt(LEASE_NAME)
            .await;
        match lease {
            Ok(Some(l)) => {
                if let Some(holder) = lease_is_held(&l, jiff::Timestamp::now()) {
                    eprintln!(
                        "error: agent {holder} still holds the Lease {}/{LEASE_NAME} and would put everything back; \
                         remove the agent first (helm uninstall, or take it out of the ACM Policy), or pass --force",
                        args.namespace
                    );
                    return ExitCode::from(2);
                }
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!(
                    "error: cannot read the Lease {}/{LEASE_NAME} to check that no agent runs: {e}",
                    args.namespace
                );
                return ExitCode::FAILURE;
            }
        }
    }
    match uninstall(client, cfg).await {
        Ok((lines, ok)) => {
            for l in &lines {
                println!("{l}");
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "some hosted clusters kept their webhooks; fix what is reported and run uninstall again"
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: listing HostedControlPlanes: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: Option<&str>, renewed: &str, secs: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: Some(MicroTime(renewed.parse().expect("ts"))),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_is_held_only_by_someone_within_its_duration() {
        let now: jiff::Timestamp = "2026-11-22T12:00:10Z".parse().expect("ts");
        assert_eq!(
            lease_is_held(&lease(Some("a"), "2026-11-22T12:00:00Z", 15), now),
            Some("a".into())
        );
        assert_eq!(
            lease_is_held(&lease(Some("a"), "2026-11-22T12:00:00Z", 5), now),
            None
        );
        assert_eq!(
            lease_is_held(&lease(None, "2026-11-22T12:00:05Z", 15), now),
            None
        );
        assert_eq!(
            lease_is_held(&lease(Some(""), "2026-11-22T12:00:05Z", 15), now),
            None
        );
        assert_eq!(lease_is_held(&Lease::default(), now), None);
    }
}
