//! Phase 2: the HCP's CA and serving certificate, read back from their Secrets and renewed or
//! rotated by the pure policy in `hcp_fleet_render::certificates`. Writing them is the admission
//! service phase's job (they are applied with the other management objects).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use tracing::info;

use crate::controller::context::Context;
use crate::controller::error::Failure;
use crate::controller::io::cache;
use crate::controller::scope::Scope;
use hcp_fleet_render::certificates;
use hcp_fleet_render::certificates::CertBundle;
use hcp_fleet_render::management;

/// The certificates this reconcile will apply, and when the serving one expires.
pub(crate) struct Certificates {
    pub(crate) bundle: CertBundle,
    /// RFC 3339.
    pub(crate) expires: String,
    /// Whether the serving certificate differs from the one in the TLS Secret (or there is
    /// none): the replicas are about to load a new one, which the hosted side must trust first.
    pub(crate) serving_changes: bool,
    /// When the plan will next change the bundle by itself (a renewal, a rotation, a previous
    /// CA expiring): the reconcile is queued for then.
    pub(crate) next_change: Option<std::time::Duration>,
}

pub(crate) fn secret_bytes(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .as_ref()
        .map(|d| d.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

async fn read(
    ctx: &Context,
    ns: &str,
    secrets: &Api<Secret>,
    store: Option<&kube::runtime::reflector::Store<Secret>>,
    name: &str,
) -> Result<Option<Secret>, Failure> {
    cache::read(ctx, ns, secrets, store, name)
        .await
        .map_err(|source| Failure::ReadCertificates {
            name: name.to_string(),
            source,
        })
}

pub(crate) async fn ensure(s: &Scope<'_>) -> Result<Certificates, Failure> {
    let (ctx, cfg, ns) = (s.ctx, s.cfg, s.ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let caches = ctx.caches();
    let ca_name = management::ca_secret_name(cfg);
    let ca = read(ctx, ns, &secrets, caches.ca_secrets.as_ref(), &ca_name).await?;
    let tls_name = management::tls_secret_name(cfg);
    let tls = read(ctx, ns, &secrets, caches.tls_secrets.as_ref(), &tls_name).await?;
    let existing = match (&ca, &tls) {
        (Some(a), Some(b)) => CertBundle::from_secret_data(&secret_bytes(a), &secret_bytes(b)),
        _ => None,
    };
    let sans = management::serving_sans(cfg, ns, &ctx.endpoints.extra_sans());
    let now = jiff::Timestamp::now().as_second();
    let (bundle, why) =
        certificates::plan(existing.as_ref(), cfg, &sans, now).map_err(Failure::Certificate)?;
    if let Some(why) = &why {
        info!(reason = %why, "certificates updated");
    }
    let facts = certificates::inspect(&bundle.serving.cert_pem).map_err(Failure::Certificate)?;
    ctx.metrics
        .cert_expiry
        .get_or_create(&s.labels())
        .set(facts.not_after);
    let expires = jiff::Timestamp::from_second(facts.not_after)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| facts.not_after.to_string());
    let live_serving = tls.as_ref().and_then(|t| secret_bytes(t).remove("tls.crt"));
    let serving_changes = live_serving.as_deref() != Some(bundle.serving.cert_pem.as_bytes());
    let next_change =
        certificates::next_change(&bundle, cfg.certificates.renew_at_remaining_percent)
            .map(|at| std::time::Duration::from_secs(u64::try_from(at - now).unwrap_or(0).max(1)));
    Ok(Certificates {
        bundle,
        expires,
        serving_changes,
        next_change,
    })
}
