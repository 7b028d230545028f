//! Phase 4: access to the hosted cluster through the kubeconfig secret in the HCP namespace.
//! The client is kept in the HCP's state and rebuilt only when the secret's data changes.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::certificates::secret_bytes;
use super::context::{Context, hcp_labels};
use super::error::Failure;
use crate::config::AgentConfig;
use crate::hosted::clients::{HostedAccessError, HostedClient};

pub async fn connect(
    ctx: &Context,
    cfg: &AgentConfig,
    ns: &str,
    cluster: &str,
) -> Result<HostedClient, Failure> {
    let access = &cfg.hosted_access;
    let secret_name = &access.kubeconfig_secret;
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get_opt(secret_name)
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
    ctx.with_hcp(ns, |s| s.hosted_client = Some(built.clone()));
    Ok(built)
}
