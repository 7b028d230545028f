//! No window where the guard is silently off: the hosted caBundle always trusts whatever any
//! replica of the admission service serves, because with failurePolicy Ignore an untrusted
//! certificate lets every request through.
//!
//! - Trust first: before a new serving certificate is written (renewal, CA rotation, Secrets
//!   deleted and made anew), the hosted configurations get the new CA *added* to the caBundle
//!   they already carry (`pre_trust`). Only then may a replica load the new certificate.
//! - Retire last: the caBundle narrows to the current bundle only once a TLS handshake with
//!   each ready replica shows the new certificate (`hosted_bundle`); until then it keeps the
//!   union, and the reconcile looks again with backoff (2 s, doubling).

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, Client};
use tracing::info;

use super::{hosted_access, hosted_webhooks};
use crate::controller::context::Context;
use crate::controller::error::Failure;
use crate::controller::io::cache;
use crate::controller::scope::Scope;
use crate::hosted::clients::HostedClient;
use hcp_fleet_render::certificates::{CertBundle, bundle_ders, union_bundle};
use hcp_fleet_render::config::AgentConfig;
use hcp_fleet_render::hosted::webhooks::{MUTATING_NAME, VALIDATING_NAME};

/// How long one handshake with a replica may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Every caBundle the agent's configurations in the hosted cluster carry now, as one bundle
/// (empty when none is installed).
pub async fn installed_trust(hosted: &Client) -> Result<String, kube::Error> {
    let mut bundle = String::new();
    let mut add = |b: Option<&k8s_openapi::ByteString>| {
        if let Some(b) = b {
            bundle = union_bundle(&bundle, &String::from_utf8_lossy(&b.0));
        }
    };
    if let Some(v) = Api::<ValidatingWebhookConfiguration>::all(hosted.clone())
        .get_opt(VALIDATING_NAME)
        .await?
    {
        for w in v.webhooks.iter().flatten() {
            add(w.client_config.ca_bundle.as_ref());
        }
    }
    if let Some(m) = Api::<MutatingWebhookConfiguration>::all(hosted.clone())
        .get_opt(MUTATING_NAME)
        .await?
    {
        for w in m.webhooks.iter().flatten() {
            add(w.client_config.ca_bundle.as_ref());
        }
    }
    Ok(bundle)
}

/// Before `certs` (with a serving certificate the replicas do not have yet) is written: if
/// replicas may be serving (the Deployment exists), the hosted configurations that are
/// installed get the new bundle added to their trust. Fails, holding the certificate back,
/// when the hosted cluster cannot be reached to do so.
pub(crate) async fn pre_trust(
    s: &Scope<'_>,
    certs: &CertBundle,
    statics: &super::static_guards::Statics,
) -> Result<Vec<String>, Failure> {
    let (ctx, cfg, ns) = (s.ctx, s.cfg, s.ns);
    let held = |f: Failure| Failure::TrustFirst(Box::new(f));
    let store = ctx.caches().deployments;
    let api = Api::<Deployment>::namespaced(ctx.client.clone(), ns);
    let deployment = cache::read(ctx, ns, &api, store.as_ref(), &cfg.admission.service_name)
        .await
        .map_err(|source| {
            held(Failure::ApplyAdmission {
                kind: "Deployment",
                name: cfg.admission.service_name.clone(),
                source,
            })
        })?;
    if deployment.is_none() {
        return Ok(Vec::new()); // nothing serves yet
    }
    let hosted = hosted_access::connect(s).await.map_err(held)?;
    let installed = installed_trust(&hosted.client()).await.map_err(|source| {
        held(Failure::HostedApi {
            server: hosted.server.clone(),
            secret: hosted.secret.clone(),
            source,
        })
    })?;
    if installed.is_empty() {
        return Ok(Vec::new()); // nothing installed that could distrust the new certificate
    }
    let want = certs.ca_bundle_pem();
    let have = bundle_ders(&installed);
    if bundle_ders(&want).iter().all(|d| have.contains(d)) {
        return Ok(Vec::new());
    }
    info!("adding the new CA to the hosted caBundle before the new certificate is served");
    let widened = union_bundle(&want, &installed);
    // The new certificate is not served yet: replicas may be about to restart with it.
    let proof = super::proof::Proof {
        key: certs.probe_key.clone(),
        rolling_out: true,
    };
    // Only the caBundle changes here: the pod image spec mutation's policy stays as last
    // rendered.
    let registry = super::internal_registry::last(s);
    let want = hosted_webhooks::Want {
        ca_bundle: &widened,
        revision: s.revision,
        proof: &proof,
        statics,
        registry: registry.as_ref(),
        // A new certificate is trusted only where the service runs.
        service: true,
    };
    let done = hosted_webhooks::ensure(s, &hosted, want)
        .await
        .map_err(held)?;
    Ok(done.drift)
}

/// This phase's part of an HCP's state (`HcpState::trust`), written only here.
#[derive(Debug, Default)]
pub(in crate::controller) struct Settled {
    /// The serving certificate (fingerprint) every replica was seen to serve, the hosted
    /// caBundle narrowed to its CA (`hosted_bundle`).
    serving: Option<u64>,
    /// Reconciles in a row that found a replica not yet serving the current certificate
    /// (the previous CA stays trusted meanwhile); paces the next look.
    unsettled: u32,
}

/// Reconciles in a row, this one included, that found the caBundle not `settled`.
pub(in crate::controller) fn unsettled_in_a_row(s: &Scope<'_>, settled: bool) -> u32 {
    s.ctx.with_hcp(s.ns, |h| {
        crate::controller::reconcile::in_a_row(&mut h.trust.unsettled, !settled)
    })
}

/// A retired admission service: the next one's certificate must be seen served again before
/// it is settled.
pub(in crate::controller) fn forget(ctx: &Context, ns: &str) {
    ctx.with_hcp(ns, |h| h.trust.serving = None);
}

/// The caBundle the hosted configurations should carry now, and whether it is final: the
/// current bundle once every ready replica serves `certs.serving`; until then the current
/// bundle plus what is installed. Fails when replicas are listed but none completes a TLS
/// handshake: the service is down for the hosted kube-apiserver too.
pub(crate) async fn hosted_bundle(
    s: &Scope<'_>,
    hosted: &HostedClient,
    certs: &CertBundle,
) -> Result<(String, bool), Failure> {
    let (ctx, cfg, ns) = (s.ctx, s.cfg, s.ns);
    let want = certs.ca_bundle_pem();
    // Settled once for this serving certificate, settled for good: every replica loads the
    // one Secret, and a new certificate is a new fingerprint.
    let serving = hcp_fleet_model::compare::fingerprint(&serde_json::Value::String(
        certs.serving.cert_pem.clone(),
    ));
    if ctx.with_hcp(ns, |s| s.trust.serving == Some(serving)) {
        return Ok((want, true));
    }
    let settled = |bundle: String| {
        ctx.with_hcp(ns, |s| s.trust.serving = Some(serving));
        Ok((bundle, true))
    };
    let installed =
        installed_trust(&hosted.client())
            .await
            .map_err(|source| Failure::HostedApi {
                server: hosted.server.clone(),
                secret: hosted.secret.clone(),
                source,
            })?;
    // Nothing installed trusts another CA (a first install, or a converged one): there is
    // nothing to retire, and the replicas need no look (a request per HCP at a cold start).
    let have = bundle_ders(&installed);
    let current = bundle_ders(&want);
    if have.iter().all(|d| current.contains(d)) {
        return settled(want);
    }
    let served = replicas_serve(ctx, cfg, ns, &certs.serving.cert_pem).await;
    if served.replicas > 0 && served.failures.len() == served.replicas {
        return Err(Failure::AdmissionUnreachable {
            why: served.failures.join("; "),
        });
    }
    if served.replicas > 0 && served.current == served.replicas {
        return settled(want);
    }
    Ok((union_bundle(&want, &installed), false))
}

/// What the replicas serve: how many are listed, how many present `serving_pem`, and the
/// handshakes that failed.
struct Served {
    replicas: usize,
    current: usize,
    failures: Vec<String>,
}

async fn replicas_serve(ctx: &Context, cfg: &AgentConfig, ns: &str, serving_pem: &str) -> Served {
    let mut served = Served {
        replicas: 0,
        current: 0,
        failures: Vec::new(),
    };
    let Some(expected) = bundle_ders(serving_pem).into_iter().next() else {
        return served;
    };
    let replicas = match ctx
        .endpoints
        .replicas(
            &ctx.client,
            &cfg.admission.service_name,
            cfg.admission.port,
            ns,
            // Asked of the server: a rollout changes them faster than a watch is sure to show.
            crate::controller::endpoints::Seen::default(),
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            info!(error = %e, "replicas unknown; keeping the old CA trusted");
            return served;
        }
    };
    served.replicas = replicas.len();
    let name = format!("{}.{ns}.svc", cfg.admission.service_name);
    for addr in replicas {
        match crate::tls::served_certificate(addr, &name, HANDSHAKE_TIMEOUT).await {
            Ok(der) if der == expected => served.current += 1,
            Ok(_) => info!(%addr, "a replica still serves the previous certificate"),
            Err(e) => served.failures.push(e.to_string()),
        }
    }
    served
}
