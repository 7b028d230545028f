//! Phase 4: access to the hosted cluster through the kubeconfig secret in the HCP namespace.
//! The client is kept in the HCP's state and rebuilt only when the secret's data changes.

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;

use super::certificates::secret_bytes;
use crate::controller::context::{Context, lock};
use crate::controller::error::Failure;
use crate::controller::io::cache;
use crate::controller::scope::Scope;
use crate::hosted::clients::{HostedAccessError, HostedClient};
use hcp_fleet_model::crd::HostedControlPlane;

pub(crate) async fn connect(s: &Scope<'_>) -> Result<HostedClient, Failure> {
    let (ctx, cfg, ns) = (s.ctx, s.cfg, s.ns);
    let access = &cfg.hosted_access;
    let secret_name = &access.kubeconfig_secret;
    let store = ctx.caches().kubeconfig_secrets;
    let api = Api::<Secret>::namespaced(ctx.client.clone(), ns);
    let secret = cache::read(ctx, ns, &api, store.as_ref(), secret_name)
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
    let cached = ctx.with_hcp(ns, |h| {
        h.access.client.as_ref().filter(|c| c.is_from(raw)).cloned()
    });
    if let Some(c) = cached {
        reachable(s, &c)?;
        claim(s, &c).await?;
        return Ok(c);
    }
    let requests = ctx
        .metrics
        .hosted_requests
        .get_or_create(&s.labels())
        .clone();
    let built = HostedClient::build(ns, secret_name, raw, access, requests)
        .await
        .map_err(Failure::HostedAccess)?;
    ctx.with_hcp(ns, |h| {
        h.access = Access {
            client: Some(built.clone()),
            identity: None,
        };
    });
    reachable(s, &built)?;
    claim(s, &built).await?;
    Ok(built)
}

/// This phase's part of an HCP's state (`HcpState::access`), written only here: the hosted
/// client, kept while the kubeconfig Secret is unchanged, and the hosted cluster's identity
/// (kube-system UID) once this namespace's claim on it is confirmed (cleared with the client).
#[derive(Default)]
pub(in crate::controller) struct Access {
    client: Option<HostedClient>,
    identity: Option<String>,
}

impl Access {
    pub(in crate::controller) fn client(&self) -> Option<&HostedClient> {
        self.client.as_ref()
    }

    pub(in crate::controller) fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }
}

/// A connection the drift watch saw drop (keepalive unanswered) is reported at once, before
/// any request to the hosted cluster (every hosted step starts here), not after another request's timeout.
fn reachable(s: &Scope<'_>, hosted: &HostedClient) -> Result<(), Failure> {
    let (ctx, ns) = (s.ctx, s.ns);
    let lost = ctx.with_hcp(ns, |h| {
        h.watch.as_ref().and_then(|w| lock(&w.shared).lost.clone())
    });
    let Some(why) = lost else {
        return Ok(());
    };
    let labels = s.labels();
    ctx.metrics.hosted_errors.get_or_create(&labels).inc();
    ctx.metrics.webhooks_installed.get_or_create(&labels).set(0);
    Err(Failure::HostedUnreachable {
        server: hosted.server.clone(),
        why,
    })
}

/// No confused deputy: the hosted cluster must be neither the management cluster nor one
/// another HCP namespace claims. Identities are the UIDs of the clusters' kube-system
/// namespaces. The claim is recorded on the management side, in the HCP's `AdmissionHealth`
/// (`spec.hostedClusterUid`), where a restarted agent finds it again and no tenant reaches; a
/// claim by a namespace whose HCP is gone is stale and taken over. The annotation the agent
/// puts on the hosted webhook configurations (`hosted::objects::CLAIM_ANNOTATION`) is a hint for people, which
/// the hosted cluster's admins can rewrite: it is never read here, and the next apply puts it
/// back. Checked once per hosted client.
async fn claim(s: &Scope<'_>, hosted: &HostedClient) -> Result<(), Failure> {
    let (ctx, ns) = (s.ctx, s.ns);
    if ctx.with_hcp(ns, |h| h.access.identity.is_some()) {
        return Ok(());
    }
    let refuse = |e: HostedAccessError| Failure::HostedAccess(e);
    let mgmt = ctx.management_identity().await.map_err(|source| {
        refuse(HostedAccessError::ManagementIdentity {
            namespace: ns.to_string(),
            source,
        })
    })?;
    let timeout = s.cfg.hosted_access.request_timeout();
    let identity_err = |reason: String| {
        // A failed call to the hosted kube-apiserver, like any other.
        ctx.metrics.hosted_errors.get_or_create(&s.labels()).inc();
        refuse(HostedAccessError::HostedIdentity {
            namespace: ns.to_string(),
            server: hosted.server.clone(),
            reason,
        })
    };
    let namespaces = Api::<Namespace>::all(hosted.client());
    let system = tokio::time::timeout(timeout, namespaces.get("kube-system"))
        .await
        .map_err(|_| identity_err(format!("no answer within {}s", timeout.as_secs())))?
        .map_err(|e| identity_err(crate::controller::error::hosted_refusal(&e, &hosted.secret)))?;
    let uid = system.metadata.uid.unwrap_or_default();
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
    // The records: another HCP namespace that reached this cluster before (this agent, or an
    // earlier run of it). A store not yet filled (a restart) is waited for: read empty, it
    // would let the first namespace in line take any cluster.
    let mut recorded: Vec<String> = Vec::new();
    let caches = ctx.caches();
    if let (Some(store), Some(claims)) = (caches.health, caches.claims) {
        // Not the hosted cluster's failure: refused without counting it as one.
        let unread = || {
            refuse(HostedAccessError::HostedIdentity {
                namespace: ns.to_string(),
                server: hosted.server.clone(),
                reason: "the claims recorded on the management cluster (AdmissionHealth) could not be read yet".into(),
            })
        };
        tokio::time::timeout(timeout, store.wait_until_ready())
            .await
            .map_err(|_| unread())?
            .map_err(|_| unread())?;
        // From the records' index, not record by record: every HCP's first reconcile after
        // a restart asks this.
        recorded = claims.others(&uid, ns);
    }
    for other in recorded {
        if hcp_exists(ctx, &other).await {
            return Err(claimed(format!("HCP namespace {other}")));
        }
        tracing::warn!(previous = %other, "taking over the claim of an HCP namespace that has no HostedControlPlane any more");
    }
    // Checked and recorded under one lock, so two namespaces first seen together cannot
    // both claim one cluster.
    let mut hcps = ctx.hcps();
    if let Some(other) = hcps
        .iter()
        .find(|(n, s)| n.as_str() != ns && s.access.identity.as_deref() == Some(uid.as_str()))
        .map(|(n, _)| n.clone())
    {
        return Err(claimed(format!("HCP namespace {other}")));
    }
    hcps.entry(ns.to_string()).or_default().access.identity = Some(uid);
    Ok(())
}

async fn hcp_exists(ctx: &Context, ns: &str) -> bool {
    // On error, assume it exists: refusing is the safe side of a doubt.
    Api::<HostedControlPlane>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .map(|l| !l.items.is_empty())
        .unwrap_or(true)
}
