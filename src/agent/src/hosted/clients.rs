//! Clients for hosted kube-apiservers, built only from validated kubeconfigs. Each remembers
//! a hash of the secret data it was built from, so the controller (which keeps one per HCP in
//! that HCP's state) rebuilds it when the secret rotates and never otherwise.

use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::kubeconfig::{KubeconfigError, validate};
use hcp_fleet_render::config::HostedAccessConfig;
use hcp_fleet_render::hosted::objects::HostedFeatures;

#[derive(Debug, thiserror::Error)]
pub enum HostedAccessError {
    #[error("{namespace}: reading kubeconfig secret {secret}: {}", crate::human::KubeError(.source))]
    ReadSecret {
        namespace: String,
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error("{namespace}: kubeconfig secret {secret} not found")]
    SecretMissing { namespace: String, secret: String },
    #[error("{namespace}: kubeconfig secret {secret} has no key {key}")]
    KeyMissing {
        namespace: String,
        secret: String,
        key: String,
    },
    #[error("{namespace}: kubeconfig in secret {secret} refused: {source}")]
    Invalid {
        namespace: String,
        secret: String,
        #[source]
        source: KubeconfigError,
    },
    #[error("{namespace}: building a client for {server}: {source}")]
    Client {
        namespace: String,
        server: String,
        #[source]
        source: ClientError,
    },
    #[error(
        "{namespace}: the management cluster's identity (the UID of its namespace kube-system) cannot be read: {}; nothing is installed in any hosted cluster until it is known", crate::human::KubeError(.source)
    )]
    ManagementIdentity {
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{namespace}: hosted kube-apiserver {server}: reading its identity (the UID of namespace kube-system): {reason}"
    )]
    HostedIdentity {
        namespace: String,
        server: String,
        reason: String,
    },
    #[error(
        "{namespace}: the kubeconfig names the management cluster itself ({server}, kube-system UID {uid}); nothing is installed there"
    )]
    IsManagementCluster {
        namespace: String,
        server: String,
        uid: String,
    },
    #[error(
        "{namespace}: the hosted cluster at {server} (kube-system UID {uid}) is already claimed by {claimed_by}; nothing is installed there"
    )]
    Claimed {
        namespace: String,
        server: String,
        uid: String,
        claimed_by: String,
    },
}

/// The request stack of one hosted kube-apiserver's connection (base URI, credentials,
/// headers, the request count, HTTP/2 with keepalive pings), shared by every clone.
pub(crate) type HostedService = tower::util::BoxCloneSyncService<
    http::Request<kube::client::Body>,
    http::Response<HostedBody>,
    Box<dyn std::error::Error + Send + Sync>,
>;

/// A hosted kube-apiserver's response body.
pub(crate) type HostedBody = LineCapped<hyper::body::Incoming>;

/// Why a validated kubeconfig gave no client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("tls-server-name {name:?}: {source}")]
    ServerName {
        name: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
}

/// A client for one hosted kube-apiserver and the (rewritten) server URL it talks to.
///
/// It holds the connection's request stack, not a kube `Client`: a kube client puts a queue
/// (tower's `Buffer`, a channel of 1,024 and its task) in front of the stack, about 20 KiB
/// for as long as it lives, and at a thousand hosted clusters held between reconciles those
/// were a tenth of the agent's memory (`make bench`, heaptrack). `client()` makes one for
/// the length of a reconcile or a probe round, over the same connection; the drift watch
/// reads the stack directly (`hosted::watch`).
#[derive(Clone)]
pub struct HostedClient {
    secret_hash: Vec<u8>,
    service: HostedService,
    default_namespace: String,
    pub server: String,
    /// The Secret its credentials came from (`namespace/name`), for messages that must say
    /// where to look when the server refuses them.
    pub(crate) secret: String,
    /// What the server offers the guards, asked once per client (a rotated kubeconfig or a
    /// restarted agent asks again); a failed question is asked again next time.
    features: std::sync::Arc<tokio::sync::OnceCell<HostedFeatures>>,
}

impl HostedClient {
    /// A kube client over this cluster's connection, to be dropped after use (see the type).
    pub fn client(&self) -> Client {
        Client::new(self.service.clone(), self.default_namespace.clone())
    }

    /// Whether the server answers, within `within`, a question no webhook sees (its version):
    /// what tells a silent kube-apiserver from a slow path behind it.
    pub(crate) async fn answers(&self, within: Duration) -> bool {
        let asked = self.client();
        matches!(
            tokio::time::timeout(within, asked.apiserver_version()).await,
            Ok(Ok(_))
        )
    }

    /// The connection's request stack, for the drift watch.
    pub(crate) fn service(&self) -> HostedService {
        self.service.clone()
    }

    /// What the server offers (`webhooks::discover_features`). Unknown (the question failed)
    /// reads as nothing offered, the safe reading: the service then applies the exemptions.
    pub(crate) async fn features(&self) -> HostedFeatures {
        match self
            .features
            .get_or_try_init(|| {
                let client = self.client();
                async move { super::features::discover_features(&client).await }
            })
            .await
        {
            Ok(f) => *f,
            Err(e) => {
                tracing::warn!(server = %self.server, error = %crate::human::KubeError(&e), "cannot tell which features the hosted API server offers; installing without them");
                HostedFeatures::default()
            }
        }
    }

    /// What the server offered when it was last asked (`features`), without asking again;
    /// `None` where it never answered.
    pub(crate) fn known_features(&self) -> Option<HostedFeatures> {
        self.features.get().copied()
    }

    /// Was this client built from exactly these kubeconfig bytes?
    pub(crate) fn is_from(&self, raw: &[u8]) -> bool {
        self.secret_hash == hcp_fleet_guards::crypto::sha256(raw)
    }

    /// A client from the secret's kubeconfig bytes, refused unless the kubeconfig is
    /// self-contained (see `kubeconfig::validate`). Every request is counted in `requests`.
    pub async fn build(
        namespace: &str,
        secret_name: &str,
        raw: &[u8],
        access: &HostedAccessConfig,
        requests: prometheus_client::metrics::counter::Counter,
    ) -> Result<Self, HostedAccessError> {
        let valid = validate(
            raw,
            namespace,
            &access.server_rewrites,
            &access.allowed_servers,
        )
        .map_err(|source| HostedAccessError::Invalid {
            namespace: namespace.to_string(),
            secret: secret_name.to_string(),
            source,
        })?;
        let client_err = |source: ClientError| HostedAccessError::Client {
            namespace: namespace.to_string(),
            server: valid.server.clone(),
            source,
        };
        let kc = Kubeconfig::from_yaml(&valid.yaml).map_err(|e| client_err(e.into()))?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| client_err(e.into()))?;
        let t = access.request_timeout();
        config.connect_timeout = Some(t);
        config.write_timeout = Some(t);
        // No read timeout: the drift watches are quiet for minutes between events, and a
        // short one would cut and reopen them every few seconds (polling in disguise, seen in
        // `make bench`). Liveness comes from HTTP/2 pings instead (`keepalive_service`); the
        // install step has its own deadline.
        let default_namespace = config.default_namespace.clone();
        let service = keepalive_service(config, requests).map_err(client_err)?;
        Ok(Self {
            secret_hash: hcp_fleet_guards::crypto::sha256(raw),
            service,
            default_namespace,
            server: valid.server,
            secret: format!("{namespace}/{secret_name}"),
            features: Default::default(),
        })
    }
}

/// The request got no answer from the server (a refused or dropped connection, a keepalive
/// that went unanswered), as opposed to the server answering with an error status.
pub(crate) fn unanswered(e: &kube::Error) -> bool {
    !matches!(e, kube::Error::Api(_))
}

/// How often an HTTP/2 connection to a hosted kube-apiserver is pinged, and how long a ping
/// may go unanswered before the connection (and every watch on it) is dropped. A stopped
/// server (SIGSTOP, a frozen node) keeps TCP alive from the kernel, so only a ping the
/// server's own process must answer tells it apart from a quiet one. Costs no API request:
/// a PING frame each way every `KEEPALIVE_INTERVAL`. A hang is seen within interval plus
/// timeout, each rounded up to the agent's grid (`crate::grid::CONNECTION_GRAIN`): 16 s, inside
/// the 20 s an SRE is promised. The pings' wake-ups led the idle CPU profile at a thousand
/// hosted clusters (`make bench`, perf): every 10 s rather than 5 s halved them, and the grid
/// serves a whole point's pings with one wake-up.
pub(crate) const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub(crate) const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTP/2 flow-control windows of a hosted connection (see `keepalive_service`).
pub(crate) const HOSTED_STREAM_WINDOW: u32 = 256 * 1024;
pub(crate) const HOSTED_CONNECTION_WINDOW: u32 = 1024 * 1024;

/// kube's request stack (base URI, credentials, headers) over an HTTP/2 connection with
/// keepalive pings (HTTP/1.1 where the server does not offer h2, without pings), every
/// request counted in `requests`.
pub(crate) fn keepalive_service(
    config: kube::Config,
    requests: prometheus_client::metrics::counter::Counter,
) -> Result<HostedService, ClientError> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;
    hcp_fleet_guards::crypto::install_provider();
    let mut tls = config.rustls_client_config()?;
    // One server per client, on one long-lived HTTP/2 connection: rustls's default cache of
    // 256 sessions is allocated whole with each config, which a thousand hosted clients
    // multiply into tens of megabytes (the scale benchmark). Two sessions cover a reconnect.
    tls.resumption = rustls::client::Resumption::in_memory_sessions(2);
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    http.set_nodelay(true);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|source| {
            ClientError::ServerName {
                name: name.clone(),
                source,
            }
        })?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_all_versions().wrap_connector(http);
    let client = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        // The pings on the agent's grid: thousands of connections' pings each wake the agent
        // once for all of them rather than once each (`crate::grid`).
        .timer(crate::grid::GridTimer::new(crate::grid::CONNECTION_GRAIN))
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        // What a hosted API server may send ahead of the agent's reading: the objects here are
        // small, and hyper's defaults (2 MiB a stream, 5 MiB a connection) let a relist fill
        // buffers that, freed, the allocator keeps for the process's life, per hosted cluster.
        .http2_initial_stream_window_size(HOSTED_STREAM_WINDOW)
        .http2_initial_connection_window_size(HOSTED_CONNECTION_WINDOW)
        .build(https);
    let count = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        requests.inc();
        req
    });
    let service = ServiceBuilder::new()
        .map_response(|r: http::Response<hyper::body::Incoming>| r.map(LineCapped::new))
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(count)
        .map_err(|e: hyper_util::client::legacy::Error| {
            Box::new(e) as Box<dyn std::error::Error + Send + Sync>
        })
        .service(client);
    Ok(tower::util::BoxCloneSyncService::new(service))
}

/// The most bytes a hosted API server may send without a line break: one watch event, or one
/// whole (compact JSON) response. An object is at most 1.5 MiB (etcd's limit) and the agent
/// reads its own objects by name, never a tenant's by label, so only a server gone wrong comes
/// near it; such a response fails, and the cluster is reported with
/// the reason, instead of the agent holding whatever it sends.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// A response body that fails once `max` bytes pass without a line break.
pub(crate) struct LineCapped<B> {
    inner: B,
    run: usize,
    max: usize,
}

impl<B> LineCapped<B> {
    pub(crate) fn new(inner: B) -> Self {
        Self::with_max(inner, MAX_LINE_BYTES)
    }

    pub(crate) fn with_max(inner: B, max: usize) -> Self {
        Self { inner, run: 0, max }
    }
}

/// A hosted API server sent a line longer than `LineCapped`'s limit.
#[derive(Debug, thiserror::Error)]
#[error(
    "the hosted kube-apiserver sent more than {0} bytes without a line break; the response was refused"
)]
pub(crate) struct LineTooLong(pub usize);

impl<B> hyper::body::Body for LineCapped<B>
where
    B: hyper::body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    // Every line this frame ends, and the one it leaves open: the first
                    // continues the line the frame before left open.
                    let mut longest = 0;
                    for (i, line) in data.split(|b| *b == b'\n').enumerate() {
                        let len = if i == 0 {
                            self.run.saturating_add(line.len())
                        } else {
                            line.len()
                        };
                        longest = longest.max(len);
                        self.run = len;
                    }
                    if longest > self.max {
                        return Poll::Ready(Some(Err(Box::new(LineTooLong(self.max)))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod line_cap_tests {
    use super::*;

    /// A body passes while its lines are short, however long it is; one line longer than the
    /// cap fails it, with the reason.
    #[tokio::test]
    async fn a_line_longer_than_the_cap_fails_the_body() {
        use http_body_util::BodyExt;
        let stream = |chunks: Vec<&'static [u8]>| {
            let frames = chunks.into_iter().map(|c| {
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(
                    bytes::Bytes::from_static(c),
                ))
            });
            http_body_util::StreamBody::new(futures::stream::iter(frames))
        };
        // Short lines: 36 bytes in all, never more than 8 before a break.
        let ok = LineCapped::with_max(
            stream(vec![
                b"12345678\n",
                b"1234",
                b"5678\n12",
                b"345678\n",
                b"12345678\n",
            ]),
            10,
        );
        let all = ok.collect().await.expect("short lines pass").to_bytes();
        assert_eq!(all.len(), 36);
        // A line split across frames, 12 bytes before its break.
        let long = LineCapped::with_max(stream(vec![b"1234", b"5678", b"9012\n"]), 10);
        let err = long.collect().await.expect_err("refused");
        assert!(
            err.to_string()
                .contains("more than 10 bytes without a line break"),
            "{err}"
        );
    }
}
