//! The agent's `/metrics` over HTTPS for Prometheus, as controller-runtime's secure metrics
//! serving does it: the caller's bearer token is checked with a TokenReview, and what it
//! authenticates as must be allowed `get` on the non-resource URL `/metrics` (a
//! SubjectAccessReview), both asked of the management kube-apiserver. Plain HTTP is served on
//! loopback only (`--metrics-addr`), and health on its own port (`--health-addr`) for the
//! kubelet's probes.
//!
//! Verdicts are kept a short while (allowed a minute, refused ten seconds, as the API server's
//! own webhook authenticator and authorizer cache them), so a Prometheus scraping every 30 s
//! costs about two reviews a minute; at most `MAX_REVIEWS` are asked at once, and a caller with
//! a new token each time is answered 503 past that rather than turning scrapes into a flood
//! of reviews against the management API.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::metrics::Metrics;

/// The path and verb a reader must be allowed (the chart's `<release>-metrics-reader`
/// ClusterRole grants exactly this).
pub(crate) const PATH: &str = "/metrics";
pub(crate) const VERB: &str = "get";
/// How long a verdict is kept.
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Reviews in flight at once, and verdicts kept.
pub(crate) const MAX_REVIEWS: usize = 4;
const MAX_KEPT: usize = 256;

/// What the reviews said of a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed,
    /// The TokenReview did not authenticate it.
    Unauthenticated,
    /// Authenticated as this user, who may not `get /metrics`.
    Forbidden(String),
}

#[derive(thiserror::Error, Debug)]
pub(crate) enum ReviewError {
    #[error("the TokenReview failed: {}", crate::human::KubeError(.0))]
    TokenReview(#[source] kube::Error),
    #[error("the SubjectAccessReview failed: {}", crate::human::KubeError(.0))]
    AccessReview(#[source] kube::Error),
}

/// Asks the management API who a token is and whether it may read the metrics.
pub(crate) struct Reviewer {
    client: Client,
    kept: Mutex<HashMap<Vec<u8>, (Instant, Verdict)>>,
    in_flight: tokio::sync::Semaphore,
}

impl Reviewer {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            kept: Mutex::new(HashMap::new()),
            in_flight: tokio::sync::Semaphore::new(MAX_REVIEWS),
        }
    }

    fn kept(&self, key: &[u8]) -> Option<Verdict> {
        let kept = self.kept.lock().ok()?;
        let (until, v) = kept.get(key)?;
        (Instant::now() < *until).then(|| v.clone())
    }

    fn keep(&self, key: Vec<u8>, v: &Verdict) {
        let ttl = if *v == Verdict::Allowed {
            ALLOWED_FOR
        } else {
            REFUSED_FOR
        };
        if let Ok(mut kept) = self.kept.lock() {
            let now = Instant::now();
            kept.retain(|_, (until, _)| *until > now);
            // Full of live entries: new tokens every time. Start again rather than grow.
            if kept.len() >= MAX_KEPT {
                kept.clear();
            }
            kept.insert(key, (now + ttl, v.clone()));
        }
    }

    /// The verdict on `token`; `None` when too many reviews are in flight already.
    pub(crate) async fn review(&self, token: &str) -> Result<Option<Verdict>, ReviewError> {
        // Only a digest of the token is kept.
        let key = hcp_fleet_guards::crypto::sha256(token.as_bytes());
        if let Some(v) = self.kept(&key) {
            return Ok(Some(v));
        }
        let Ok(_permit) = self.in_flight.try_acquire() else {
            return Ok(None);
        };
        let v = self.ask(token).await?;
        self.keep(key, &v);
        Ok(Some(v))
    }

    async fn ask(&self, token: &str) -> Result<Verdict, ReviewError> {
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &tr)
            .await
            .map_err(ReviewError::TokenReview)?;
        let status = reviewed.status.unwrap_or_default();
        let (true, Some(user)) = (status.authenticated.unwrap_or(false), status.user) else {
            return Ok(Verdict::Unauthenticated);
        };
        let name = user.username.clone().unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(PATH.into()),
                    verb: Some(VERB.into()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .map_err(ReviewError::AccessReview)?;
        Ok(if decided.status.is_some_and(|s| s.allowed) {
            Verdict::Allowed
        } else {
            Verdict::Forbidden(name)
        })
    }
}

/// The token of an `Authorization: Bearer …` header.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

struct Secured {
    metrics: Arc<Metrics>,
    reviewer: Reviewer,
}

async fn metrics(State(st): State<Arc<Secured>>, headers: HeaderMap) -> Response {
    let Some(token) = bearer(&headers) else {
        return (
            StatusCode::UNAUTHORIZED,
            "a bearer token is required (Prometheus: the ServiceMonitor's authorization)",
        )
            .into_response();
    };
    match st.reviewer.review(token).await {
        Ok(Some(Verdict::Allowed)) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            st.metrics.encode(),
        )
            .into_response(),
        Ok(Some(Verdict::Unauthenticated)) => {
            (StatusCode::UNAUTHORIZED, "the token was not accepted").into_response()
        }
        Ok(Some(Verdict::Forbidden(user))) => (
            StatusCode::FORBIDDEN,
            format!(
                "{} may not get {PATH}: bind it to the chart's metrics-reader ClusterRole",
                hcp_fleet_render::reporting::untrusted(&user, 256)
            ),
        )
            .into_response(),
        Ok(None) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many token reviews in flight; try again",
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "reviewing a metrics scrape's token");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the management API could not review the token",
            )
                .into_response()
        }
    }
}

/// The HTTPS router: `/metrics` behind the reviews.
pub fn router(metrics: Arc<Metrics>, client: Client) -> axum::Router {
    let st = Arc::new(Secured {
        metrics,
        reviewer: Reviewer::new(client),
    });
    axum::Router::new()
        .route(PATH, axum::routing::get(self::metrics))
        .with_state(st)
}

/// Why the HTTPS metrics endpoint has no serving certificate.
#[derive(Debug, thiserror::Error)]
pub enum MetricsTlsError {
    #[error(transparent)]
    Mounted(#[from] hcp_fleet_webhook::tls::TlsError),
    #[error("the self-signed certificate: {0}")]
    SelfSigned(#[from] hcp_fleet_render::certificates::CertError),
    #[error("the self-signed certificate's PEM: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("rustls refused the certificate: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The TLS configuration: the certificate from `dir` (`tls.crt`, `tls.key`: a Secret from
/// cert-manager or OpenShift's service CA, re-read when it rotates), or else a self-signed one
/// made now for `names`, held in memory (the root filesystem is read-only), which Prometheus
/// scrapes without verifying, as the chart's ServiceMonitor says.
pub fn tls(
    dir: Option<&Path>,
    names: &[String],
) -> Result<Arc<rustls::ServerConfig>, MetricsTlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cfg = match dir {
        Some(d) => {
            let reloading =
                hcp_fleet_webhook::tls::ReloadingCert::new(d.join("tls.crt"), d.join("tls.key"))?;
            reloading.watch(Duration::from_secs(30));
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_cert_resolver(reloading)
        }
        None => {
            let ca = hcp_fleet_render::certificates::generate_ca(
                "hcp-fleet-agent metrics (self-signed)",
                time::Duration::days(365),
            )?;
            let leaf = hcp_fleet_render::certificates::issue(
                &ca,
                names
                    .first()
                    .map_or("hcp-fleet-agent-metrics", String::as_str),
                &hcp_fleet_render::certificates::Usage::Server {
                    sans: names.to_vec(),
                },
                time::Duration::days(365),
            )?;
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                    .collect::<Result<_, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes())?;
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(chain, key)?
        }
    };
    let mut cfg = cfg;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves `app` over TLS on `listener` until the task is aborted, at most 64 connections at
/// once (a scrape needs one).
pub fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
) -> tokio::task::JoinHandle<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::service::TowerToHyperService;
    tokio::spawn(async move {
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let slots = Arc::new(tokio::sync::Semaphore::new(64));
        loop {
            let (tcp, _): (tokio::net::TcpStream, SocketAddr) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a metrics connection failed");
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let acceptor = acceptor.clone();
            let svc = TowerToHyperService::new(app.clone());
            tokio::spawn(async move {
                let _slot = slot;
                let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                else {
                    return;
                };
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_is_taken() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, v.parse().expect("header"));
            m
        };
        assert_eq!(bearer(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&h("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(&h("Basic abc")), None);
        assert_eq!(bearer(&h("Bearer ")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
