//! Phase 3: the admission service in the HCP namespace. Renders every management-side object
//! (pure, `crate::management`), applies them in dependency order (certificates before the pods
//! that mount them), and reports whether the Deployment is available.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::apply::apply;
use super::context::Context;
use super::error::Failure;
use crate::certificates::CertBundle;
use crate::config::AgentConfig;
use crate::management::{self, HcpInputs};

async fn put<K>(api: Api<K>, kind: &'static str, name: &str, obj: &K) -> Result<K, Failure>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    apply(&api, name, obj)
        .await
        .map_err(|source| Failure::ApplyAdmission {
            kind,
            name: name.to_string(),
            source,
        })
}

/// Applies the admission service; returns the Deployment as the server has it now.
pub async fn ensure(
    ctx: &Context,
    cfg: &AgentConfig,
    ns: &str,
    owner: Option<OwnerReference>,
    certs: &CertBundle,
) -> Result<Deployment, Failure> {
    let objs = management::render(
        cfg,
        &HcpInputs {
            namespace: ns,
            owner,
            certs,
            pdb_api: ctx.caps.pdb_api,
        },
    )
    .map_err(Failure::RenderAdmission)?;
    let c = || ctx.client.clone();
    let name = cfg.admission.service_name.as_str();
    let secrets = || Api::<Secret>::namespaced(c(), ns);
    put(
        secrets(),
        "Secret",
        &management::ca_secret_name(cfg),
        &objs.ca_secret,
    )
    .await?;
    put(
        secrets(),
        "Secret",
        &management::tls_secret_name(cfg),
        &objs.tls_secret,
    )
    .await?;
    put(
        Api::<ServiceAccount>::namespaced(c(), ns),
        "ServiceAccount",
        name,
        &objs.service_account,
    )
    .await?;
    put(
        Api::<Service>::namespaced(c(), ns),
        "Service",
        name,
        &objs.service,
    )
    .await?;
    put(
        Api::<NetworkPolicy>::namespaced(c(), ns),
        "NetworkPolicy",
        name,
        &objs.network_policy,
    )
    .await?;
    if let (Some(pdb), Some(ar)) = (&objs.pdb, ctx.caps.pdb_api.api_resource()) {
        let api = Api::<DynamicObject>::namespaced_with(c(), ns, &ar);
        put(api, "PodDisruptionBudget", name, pdb).await?;
    }
    put(
        Api::<Deployment>::namespaced(c(), ns),
        "Deployment",
        name,
        &objs.deployment,
    )
    .await
}
