//! Phase 4: access to the hosted cluster through the kubeconfig secret in the HCP namespace.
//! The client is kept in the HCP's state and rebuilt only when the secret's data changes.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;

use super::certificates::secret_bytes;
use super::context::{Context, hcp_labels, lock};
use super::error::Failure;
use crate::config::AgentConfig;
use crate::crd::HostedControlPlane;
use crate::hosted::clients::{HostedAccessError, HostedClient};
use crate::hosted::webhooks::{CLAIM_ANNOTATION, MUTATING_NAME, VALIDATING_NAME};

pub async fn connect(
    ctx: &Context,
    cfg: &AgentConfig,
    ns: &str,
    cluster: &str,
) -> Result<HostedClient, Failure> {
    let access = &cfg.hosted_access;
    let secret_name = &access.kubeconfig_secret;
    let store = ctx.caches().kubeconfig_secrets;
    let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    let secret = super::cache::read(ctx, ns, &api, store.as_ref(), secret_name, &())
        .await
        .map_err(|source| {
            Failure::HostedAccess(HostedAccessError::ReadSecret {
                namespace: ns.to_string(),
                secret: secret_name.clone(),
                source,
            })
        })?
        .ok_or_else(|| {
            Failure::HostedAccess(HostedAccessError::SecretMissing {
                namespace: ns.to_string(),
                secret: secret_name.clone(),
            })
        })?;
    let data = secret_bytes(&secret);
    let raw = data.get(&access.kubeconfig_key).ok_or_else(|| {
        Failure::HostedAccess(HostedAccessError::KeyMissing {
            namespace: ns.to_string(),
            secret: secret_name.clone(),
            key: access.kubeconfig_key.clone(),
        })
    })?;
    let cached = ctx.with_hcp(ns, |s| {
        s.hosted_client.as_ref().filter(|c| c.is_from(raw)).cloned()
    });
    if let Some(c) = cached {
        reachable(ctx, ns, cluster, &c)?;
        claim(ctx, cfg, ns, cluster, &c).await?;
        return Ok(c);
    }
    let requests = ctx
        .metrics
        .hosted_requests
        .get_or_create(&hcp_labels(ns, cluster))
        .clone();
    let built = HostedClient::build(ns, secret_name, raw, access, requests)
        .await
        .map_err(Failure::HostedAccess)?;
    ctx.with_hcp(ns, |s| {
        s.hosted_client = Some(built.clone());
        s.hosted_identity = None;
    });
    reachable(ctx, ns, cluster, &built)?;
    claim(ctx, cfg, ns, cluster, &built).await?;
    Ok(built)
}

/// A connection the drift watch saw drop (keepalive unanswered) is reported at once, before
/// any request to the hosted cluster (every hosted step starts here), not after another request's timeout.
fn reachable(ctx: &Context, ns: &str, cluster: &str, hosted: &HostedClient) -> Result<(), Failure> {
    let lost = ctx.with_hcp(ns, |s| {
        s.watch.as_ref().and_then(|w| lock(&w.shared).lost.clone())
    });
    let Some(why) = lost else {
        return Ok(());
    };
    let labels = hcp_labels(ns, cluster);
    ctx.metrics.hosted_errors.get_or_create(&labels).inc();
    ctx.metrics.webhooks_installed.get_or_create(&labels).set(0);
    Err(Failure::HostedUnreachable {
        server: hosted.server.clone(),
        why,
    })
}

/// No confused deputy: the hosted cluster must be neither the management cluster nor one
/// another HCP namespace claims. Identities are the UIDs of the clusters' kube-system
/// namespaces. The claim is recorded on the webhook configurations the agent installs
/// (annotation `CLAIM_ANNOTATION`), where a restarted agent finds it again; a claim by a
/// namespace whose HCP is gone is stale and taken over. Checked once per hosted client.
async fn claim(
    ctx: &Context,
    cfg: &AgentConfig,
    ns: &str,
    cluster: &str,
    hosted: &HostedClient,
) -> Result<(), Failure> {
    if ctx.with_hcp(ns, |s| s.hosted_identity.is_some()) {
        return Ok(());
    }
    let refuse = |e: HostedAccessError| Failure::HostedAccess(e);
    let mgmt = ctx.management_identity().await.map_err(|source| {
        refuse(HostedAccessError::ManagementIdentity {
            namespace: ns.to_string(),
            source,
        })
    })?;
    let timeout = Duration::from_secs(u64::from(cfg.hosted_access.request_timeout_seconds));
    let identity_err = |reason: String| {
        // A failed call to the hosted kube-apiserver, like any other.
        ctx.metrics
            .hosted_errors
            .get_or_create(&hcp_labels(ns, cluster))
            .inc();
        refuse(HostedAccessError::HostedIdentity {
            namespace: ns.to_string(),
            server: hosted.server.clone(),
            reason,
        })
    };
    let read = async {
        let system = Api::<Namespace>::all(hosted.client.clone())
            .get("kube-system")
            .await?;
        let recorded = recorded_claim(&hosted.client).await?;
        Ok::<_, kube::Error>((system.metadata.uid.unwrap_or_default(), recorded))
    };
    let (uid, recorded) = tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| identity_err(format!("no answer within {}s", timeout.as_secs())))?
        .map_err(|e| identity_err(e.to_string()))?;
    if uid.is_empty() {
        return Err(identity_err("namespace kube-system has no UID".into()));
    }
    let claimed = |by: String| {
        refuse(HostedAccessError::Claimed {
            namespace: ns.to_string(),
            server: hosted.server.clone(),
            uid: uid.clone(),
            claimed_by: by,
        })
    };
    if uid == mgmt {
        return Err(refuse(HostedAccessError::IsManagementCluster {
            namespace: ns.to_string(),
            server: hosted.server.clone(),
            uid,
        }));
    }
    let ours = crate::hosted::webhooks::claim_value(&mgmt, ns);
    if let Some((their_mgmt, their_ns)) = recorded
        .as_deref()
        .filter(|c| *c != ours)
        .and_then(|c| c.split_once('/'))
    {
        if their_mgmt != mgmt {
            return Err(claimed(format!(
                "HCP namespace {their_ns} of another management cluster (kube-system UID {their_mgmt})"
            )));
        }
        if hcp_exists(ctx, their_ns).await {
            return Err(claimed(format!("HCP namespace {their_ns}")));
        }
        tracing::warn!(previous = %their_ns, "taking over the claim of an HCP namespace that has no HostedControlPlane any more");
    }
    // Checked and recorded under one lock, so two namespaces first seen together cannot
    // both claim one cluster.
    let mut hcps = ctx.hcps();
    if let Some(other) = hcps
        .iter()
        .find(|(n, s)| n.as_str() != ns && s.hosted_identity.as_deref() == Some(uid.as_str()))
        .map(|(n, _)| n.clone())
    {
        return Err(claimed(format!("HCP namespace {other}")));
    }
    hcps.entry(ns.to_string()).or_default().hosted_identity = Some(uid);
    Ok(())
}

/// The claim recorded on the agent's webhook configurations in the hosted cluster, if any.
async fn recorded_claim(hosted: &kube::Client) -> Result<Option<String>, kube::Error> {
    let v = Api::<ValidatingWebhookConfiguration>::all(hosted.clone())
        .get_metadata_opt(VALIDATING_NAME)
        .await?;
    let claim = |m: Option<kube::api::ObjectMeta>| {
        m.and_then(|m| m.annotations.and_then(|a| a.get(CLAIM_ANNOTATION).cloned()))
    };
    if let Some(c) = claim(v.map(|v| v.metadata)) {
        return Ok(Some(c));
    }
    let m = Api::<MutatingWebhookConfiguration>::all(hosted.clone())
        .get_metadata_opt(MUTATING_NAME)
        .await?;
    Ok(claim(m.map(|m| m.metadata)))
}

async fn hcp_exists(ctx: &Context, ns: &str) -> bool {
    // On error, assume it exists: refusing is the safe side of a doubt.
    Api::<HostedControlPlane>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .map(|l| !l.items.is_empty())
        .unwrap_or(true)
}
