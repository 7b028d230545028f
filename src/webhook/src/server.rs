//! The admission service's HTTPS server, in small layers with one job each: TLS accept with a
//! handshake timeout; HTTP/1.1 and HTTP/2 (hyper) with a header read timeout; a body read
//! bounded in size and time; the decision under a deadline shorter than any webhook's
//! timeoutSeconds; graceful drain on SIGTERM. The hot path takes no exclusive lock and calls
//! nothing outside the process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;

use super::decision;
use hcp_fleet_guards::review::Decision;
use hcp_fleet_guards::{Settings, review};

/// Kubernetes sends at most about 3 MiB of object; anything larger is not a review.
pub(crate) const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// The default of `Limits::max_connections`: far above what one hosted kube-apiserver holds
/// (it reuses a few connections per replica), far below the process's file limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// The default of `Limits::spin`, in microseconds: longer than the gap between an answer and
/// the next request of a closed-loop client on one connection (about 40 µs here), far shorter
/// than anything a person or a timer sees.
pub const DEFAULT_SPIN_MICROS: u64 = 60;

#[derive(Debug, Clone)]
pub struct Limits {
    pub body_read: Duration,
    pub header_read: Duration,
    pub handshake: Duration,
    /// Shorter than the smallest webhook timeoutSeconds (1 s), so the API server always hears
    /// from us before it gives up.
    pub deadline: Duration,
    pub drain: Duration,
    /// Connections open at once (TLS handshakes in progress included); one more is closed at
    /// once, so a flood of connections cannot take the memory every answer needs.
    pub max_connections: usize,
    /// HTTP/2 keep-alive: a PING this often on a quiet connection, and the connection closed
    /// when half as long passes without an answer (a peer gone without a word).
    pub h2_keep_alive: Duration,
    /// How long a connection thread about to sleep spins first, watching its connections
    /// (`spin`); zero: it sleeps at once.
    pub spin: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            body_read: Duration::from_millis(500),
            header_read: Duration::from_secs(5),
            handshake: Duration::from_secs(5),
            deadline: Duration::from_millis(800),
            drain: Duration::from_secs(20),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            h2_keep_alive: Duration::from_secs(20),
            spin: Duration::from_micros(DEFAULT_SPIN_MICROS),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    pub(crate) webhook: String,
    pub(crate) decision: String,
    pub(crate) outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DenialLabels {
    pub(crate) webhook: String,
    pub(crate) sender: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WebhookLabel {
    pub(crate) webhook: String,
}

fn latency() -> Histogram {
    // 20 µs to about 0.5 s in steps of 1.5x: fine enough to tell 0.3 ms from 0.45 ms.
    Histogram::new(exponential_buckets(0.00002, 1.5, 26))
}

pub struct AdmissionMetrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    denials: Family<DenialLabels, Counter>,
    latency: Family<WebhookLabel, Histogram, fn() -> Histogram>,
}

impl Default for AdmissionMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AdmissionMetrics {
    pub fn new() -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let denials = Family::<DenialLabels, Counter>::default();
        let latency =
            Family::<WebhookLabel, Histogram, fn() -> Histogram>::new_with_constructor(latency);
        let mut registry = Registry::with_prefix("hcp_fleet_admission");
        registry.register(
            "requests",
            "AdmissionReview requests by webhook, decision and outcome",
            requests.clone(),
        );
        registry.register(
            "denials",
            "Requests a guard denied (or, in warn mode, would have), by webhook and by who sent them: node, an identity class, or tenant",
            denials.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Server-side handling time of one AdmissionReview",
            latency.clone(),
        );
        Self {
            registry,
            requests,
            denials,
            latency,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn observe_latency(&self, webhook: String, seconds: f64) {
        self.latency
            .get_or_create(&WebhookLabel { webhook })
            .observe(seconds);
    }

    /// A denial (or a warn mode's would-deny) of a request from `sender`.
    pub fn count_denial(&self, webhook: &str, sender: &str) {
        self.denials
            .get_or_create(&DenialLabels {
                webhook: webhook.to_string(),
                sender: sender.to_string(),
            })
            .inc();
    }

    pub fn count(&self, webhook: &str, decision: &str, outcome: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                webhook: webhook.to_string(),
                decision: decision.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }
}

/// The (decision, outcome) pairs a review ends in.
const OUTCOMES: [(&str, &str); 6] = [
    ("denied", "enforced"),
    ("allowed", "warned"),
    ("allowed", "mutated"),
    ("allowed", "passed"),
    ("none", "bad_request"),
    ("none", "deadline"),
];

/// One served path's name and its series, looked up once: a review then counts itself
/// without building (allocating) its label set. A series appears at its first count, as
/// before.
struct Hook {
    name: String,
    /// The guard served on the path, found once (`None`: a path the service counts but no
    /// guard serves).
    guard: Option<&'static dyn hcp_fleet_guards::Guard>,
    latency: std::sync::OnceLock<Histogram>,
    counts: [std::sync::OnceLock<Counter>; OUTCOMES.len()],
    /// Its denials' series by sender (a handful: node, the identity classes, tenant), found
    /// under a read lock: building the label set per denial was a percent of the service's
    /// time under load (`make bench`, perf).
    denials: std::sync::RwLock<Vec<(&'static str, Counter)>>,
}

impl Hook {
    fn count_denial(&self, m: &AdmissionMetrics, sender: &'static str) {
        let find = |d: &[(&'static str, Counter)]| {
            d.iter()
                .find(|(s, _)| *s == sender)
                .map(|(_, c)| c.inc())
                .is_some()
        };
        if find(&self.denials.read().unwrap_or_else(PoisonError::into_inner)) {
            return;
        }
        let mut d = self.denials.write().unwrap_or_else(PoisonError::into_inner);
        if find(&d) {
            return;
        }
        let c = m
            .denials
            .get_or_create(&DenialLabels {
                webhook: self.name.clone(),
                sender: sender.to_string(),
            })
            .clone();
        c.inc();
        d.push((sender, c));
    }

    fn count(&self, m: &AdmissionMetrics, decision: &str, outcome: &str) {
        let Some(i) = OUTCOMES.iter().position(|o| *o == (decision, outcome)) else {
            return m.count(&self.name, decision, outcome);
        };
        self.counts[i]
            .get_or_init(|| {
                m.requests
                    .get_or_create(&RequestLabels {
                        webhook: self.name.clone(),
                        decision: decision.to_string(),
                        outcome: outcome.to_string(),
                    })
                    .clone()
            })
            .inc();
    }

    fn observe(&self, m: &AdmissionMetrics, seconds: f64) {
        self.latency
            .get_or_init(|| {
                m.latency
                    .get_or_create(&WebhookLabel {
                        webhook: self.name.clone(),
                    })
                    .clone()
            })
            .observe(seconds);
    }
}

pub struct AppState {
    /// Fixed at start but for the internal registry, which `internal_registry::watch`
    /// replaces when the agent's file changes; a request takes the whole value as it stands.
    settings: crate::settings_cell::SettingsCell,
    /// path → webhook name and series, fixed at start.
    hooks: HashMap<String, Hook>,
    pub(crate) metrics: AdmissionMetrics,
    /// The cluster's own requests denied lately, reported at `probe::OWN_DENIALS_PATH`.
    pub(crate) own_denials: crate::own_denials::OwnDenials,
    pub(crate) limits: Limits,
    pub draining: AtomicBool,
    /// Where the probe key is (`<cert-dir>/probe.key`), read at each probe: it arrives with
    /// the Secret, after the service may have started, and probes come once a minute.
    pub(crate) probe_key_file: Option<std::path::PathBuf>,
}

impl AppState {
    /// `probe_key_file`: where the probe key is (`None`: probes are answered without a proof).
    pub fn new(
        settings: Settings,
        limits: Limits,
        probe_key_file: Option<std::path::PathBuf>,
    ) -> Arc<Self> {
        let mut names: HashMap<String, String> = settings
            .webhooks
            .iter()
            .map(|w| (w.path.clone(), w.name.clone()))
            .collect();
        names
            .entry(hcp_fleet_guards::probe::ROW.path.to_string())
            .or_insert_with(|| "probe".into());
        let hooks = names
            .into_iter()
            .map(|(path, name)| {
                let hook = Hook {
                    guard: hcp_fleet_guards::for_path(&path),
                    name,
                    latency: Default::default(),
                    counts: Default::default(),
                    denials: Default::default(),
                };
                (path, hook)
            })
            .collect();
        Arc::new(Self {
            settings: crate::settings_cell::SettingsCell::new(settings),
            hooks,
            metrics: AdmissionMetrics::new(),
            own_denials: Default::default(),
            limits,
            draining: AtomicBool::new(false),
            probe_key_file,
        })
    }

    /// The settings as they stand now.
    pub(crate) fn settings(&self) -> Arc<Settings> {
        self.settings.current()
    }

    /// Replaces what the service knows of the internal registry; whether it changed.
    pub fn set_internal_registry(
        &self,
        reg: Option<hcp_fleet_guards::pod_image_spec::InternalRegistry>,
    ) -> bool {
        self.settings.replace(|now| {
            (now.internal_registry != reg).then(|| Settings {
                internal_registry: reg,
                ..now.clone()
            })
        })
    }

    /// The probe key, if its file is there and holds one.
    async fn probe_key(&self) -> Option<hcp_fleet_guards::probe::ProbeKey> {
        let text = tokio::fs::read_to_string(self.probe_key_file.as_ref()?)
            .await
            .ok()?;
        hcp_fleet_guards::probe::ProbeKey::from_hex(&text)
    }
}

fn error(status: StatusCode, msg: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({ "error": msg }).to_string(),
    )
        .into_response()
}

async fn admit(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let started = Instant::now();
    spin::began(st.limits.spin);
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let mut resp = match st.hooks.get(path) {
        None => unserved(&st, path, started),
        Some(hook) => {
            let resp = reviewed(&st, hook, path, &parts.headers, body, started).await;
            hook.observe(&st.metrics, started.elapsed().as_secs_f64());
            resp
        }
    };
    // Here rather than in a middleware (as the other routes have it): a layer around every
    // review was a tenth of a microsecond of the service's CPU per review (`make bench`, perf).
    close_while_draining_on(&st, parts.version, &mut resp);
    spin::answered();
    resp
}

/// A review on a guard's path, answered: 415 for a body that is not JSON, 408 or 413 for one
/// that does not arrive whole in time, 400 for one that is not a review, 503 past the
/// deadline.
async fn reviewed(
    st: &AppState,
    hook: &Hook,
    path: &str,
    headers: &http::HeaderMap,
    body: axum::body::Body,
    started: Instant,
) -> Response {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
        });
    if !json {
        hook.count(&st.metrics, "none", "bad_request");
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content type must be application/json".into(),
        );
    }
    let body = match read_body(st.limits.body_read, body).await {
        Ok(body) => body,
        Err((status, msg)) => {
            hook.count(&st.metrics, "none", "bad_request");
            return error(status, msg);
        }
    };
    match decided(st, hook, path, &body, started + st.limits.deadline).await {
        Ok((uid, d)) => {
            let (decision, outcome) = outcome_of(&d);
            hook.count(&st.metrics, decision, outcome);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                review::encode(&uid, &d),
            )
                .into_response()
        }
        Err(Some((status, msg))) => {
            hook.count(&st.metrics, "none", "bad_request");
            error(status, msg)
        }
        Err(None) => {
            // The API server applies the webhook's failurePolicy (Ignore by default).
            hook.count(&st.metrics, "none", "deadline");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "decision deadline exceeded".into(),
            )
        }
    }
}

/// The body, whole, within `limit`. Almost always it has arrived with the headers and is
/// read at the first poll, with no timer armed (arming and dropping one per review was a
/// sixth of a microsecond, `make bench`, perf); a timer bounds only a body still on its way.
async fn read_body(
    limit: Duration,
    body: axum::body::Body,
) -> Result<axum::body::Bytes, (StatusCode, String)> {
    let mut read = std::pin::pin!(axum::body::to_bytes(body, MAX_BODY_BYTES));
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await;
    let read = match first {
        std::task::Poll::Ready(read) => read,
        std::task::Poll::Pending => match tokio::time::timeout(limit, read).await {
            Ok(read) => read,
            Err(_) => {
                return Err((
                    StatusCode::REQUEST_TIMEOUT,
                    "body not received in time".into(),
                ));
            }
        },
    };
    read.map_err(|e| {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("body unreadable or over {MAX_BODY_BYTES} bytes: {e}"),
        )
    })
}

/// A review decided: its uid and the decision, or why not (`None`: the deadline passed).
/// Synchronous but for the probe key, read (from a file) only for the agent's probes and
/// canaries, and only that read waits on the deadline: nothing else in a review can.
async fn decided<'b>(
    st: &AppState,
    hook: &Hook,
    path: &str,
    body: &'b [u8],
    deadline: Instant,
) -> Result<(review::Text<'b>, Decision), Option<(StatusCode, String)>> {
    let r = review::decode(body).map_err(|e| Some((StatusCode::BAD_REQUEST, e.to_string())))?;
    let settings = st.settings();
    let decided = hook
        .guard
        .and_then(|guard| decision::decide_by(guard, path, &r, &settings));
    let (name, mut d) = decided.ok_or_else(|| {
        Some((
            StatusCode::NOT_FOUND,
            format!("no webhook is served on {path}"),
        ))
    })?;
    if let Some(e) = r.unreadable() {
        let e = review::ReviewError::Request(format!("an object cannot be read: {e}"));
        return Err(Some((StatusCode::BAD_REQUEST, e.to_string())));
    }
    if let Some(proof) = account(st, hook, &settings, name, &r, &d) {
        // Boxed: the future of every review stays the size of the common path's.
        let key = Box::pin(tokio::time::timeout_at(deadline.into(), st.probe_key()))
            .await
            .map_err(|_| None)?;
        prove(&settings, path, &r, &mut d, key.as_ref(), proof);
    }
    Ok((r.uid, d))
}

/// What a review's answer must prove with the probe key: the agent's probe's answer (the
/// probe path), a guard's denial of a request carrying a nonce, or a mutating guard's answer
/// to the agent's canary.
enum Proof<'a> {
    Probe(Option<&'a str>),
    Denial(&'a str),
    Mutation(&'a str),
}

/// What a decision leaves behind besides its answer: who was denied (a denial of the
/// cluster's own machinery is an alarm: the metric, and the report at
/// `probe::OWN_DENIALS_PATH`), and, for the agent's probe and canaries, which carry a nonce,
/// the proof that the answer came from here, which needs the probe key (`prove`).
/// The probe's denials are its answers, not denials.
fn account<'r>(
    st: &AppState,
    hook: &Hook,
    settings: &Settings,
    name: &str,
    r: &'r review::Request,
    d: &Decision,
) -> Option<Proof<'r>> {
    let probed = hook
        .guard
        .is_some_and(|g| g.scope() == hcp_fleet_guards::Scope::Everyone);
    if (!d.allowed || d.audit_annotations.contains_key("would-deny")) && !probed {
        let sender = hcp_fleet_guards::identities::sender_of(
            &r.user_info.username,
            &r.user_info.groups,
            settings,
        );
        // Under the decision's name, which is the hook's (the settings name each path's
        // webhook once); a name the hook does not hold is counted the long way.
        if name == hook.name {
            hook.count_denial(&st.metrics, sender);
        } else {
            st.metrics.count_denial(name, sender);
        }
        st.own_denials.note_now(name, sender);
    }
    let nonce = hcp_fleet_guards::probe::nonce_of(r);
    match (d.allowed, probed, nonce) {
        (true, _, Some(nonce)) => Some(Proof::Mutation(nonce)),
        (true, _, None) => None,
        (false, true, nonce) => Some(Proof::Probe(nonce)),
        (false, false, Some(nonce)) => Some(Proof::Denial(nonce)),
        (false, false, None) => None,
    }
}

/// The proof `account` asked for, with the key (`None`: the service has none yet).
fn prove(
    settings: &Settings,
    path: &str,
    r: &review::Request,
    d: &mut Decision,
    key: Option<&hcp_fleet_guards::probe::ProbeKey>,
    proof: Proof<'_>,
) {
    match proof {
        Proof::Probe(nonce) => d.message = Some(hcp_fleet_guards::probe::answer(key, nonce)),
        Proof::Denial(nonce) => {
            if let (Some(key), Some(msg)) = (key, d.message.as_deref()) {
                d.message = Some(hcp_fleet_guards::probe::signed(msg, key, nonce));
            }
        }
        Proof::Mutation(nonce) => {
            // A mutating guard's answer to the agent's canary (`guards::canary`), enforced:
            // the proof of its nonce added to the object, so the agent can tell the guard ran
            // here from a tenant's webhook making the same change. Only the canary user's
            // requests get it, and only where the guard enforces (in warn mode it changes
            // nothing, and an exempt request is never decided).
            if let Some(key) = key
                && let Some(op) =
                    hcp_fleet_guards::canary::mutation_proof(path, r, settings, key, nonce)
            {
                d.patch.push(op);
            }
        }
    }
}

/// A POST to a guard's route this service does not serve (a guard the settings leave out):
/// counted under its path, as every review is counted.
fn unserved(st: &AppState, path: &str, started: Instant) -> Response {
    st.metrics.count(path, "none", "bad_request");
    st.metrics
        .observe_latency(path.to_string(), started.elapsed().as_secs_f64());
    error(
        StatusCode::NOT_FOUND,
        format!("no webhook is served on {path}"),
    )
}

fn outcome_of(d: &Decision) -> (&'static str, &'static str) {
    match (d.allowed, d.warnings.is_empty(), d.patch.is_empty()) {
        (false, _, _) => ("denied", "enforced"),
        (true, false, _) => ("allowed", "warned"),
        (true, true, false) => ("allowed", "mutated"),
        (true, true, true) => ("allowed", "passed"),
    }
}

/// The baseline for `make bench`: the same server stack answering every POST with a fixed
/// AdmissionResponse, so the benchmark's ratio isolates what decoding and deciding cost.
async fn fixed(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let started = Instant::now();
    spin::began(st.limits.spin);
    let _ = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES).await;
    let resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        review::encode("baseline", &Decision::allow()),
    )
        .into_response();
    st.metrics
        .latency
        .get_or_create(&WebhookLabel {
            webhook: "baseline".into(),
        })
        .observe(started.elapsed().as_secs_f64());
    spin::answered();
    resp
}

pub fn baseline_router(st: Arc<AppState>) -> axum::Router {
    let mut r = axum::Router::new();
    for path in hcp_fleet_guards::paths() {
        r = r.route(path, post(fixed));
    }
    r.route("/readyz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|State(st): State<Arc<AppState>>| async move { st.metrics.encode() }),
        )
        .with_state(st)
}

pub fn router(st: Arc<AppState>) -> axum::Router {
    let mut r = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(st): State<Arc<AppState>>| async move {
                if st.draining.load(Ordering::Relaxed) {
                    (StatusCode::SERVICE_UNAVAILABLE, "draining")
                } else {
                    (StatusCode::OK, "ok")
                }
            }),
        )
        .route(hcp_fleet_guards::probe::OWN_DENIALS_PATH, get(own_denials))
        .route(
            "/metrics",
            get(|State(st): State<Arc<AppState>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    st.metrics.encode(),
                )
            }),
        )
        .layer(axum::middleware::from_fn_with_state(
            st.clone(),
            close_while_draining,
        ));
    // After the layer: a review says `Connection: close` itself (`admit`).
    for path in hcp_fleet_guards::paths() {
        r = r.route(path, post(admit));
    }
    r.with_state(st)
}

/// `GET /own-denials?nonce=<hex>`: the hosted cluster's own requests this replica denied
/// lately, proven under the HCP's probe key (`probe::own_denials`), for the agent, which asks
/// every replica (docs/admission.md, "When a guard denies the cluster"). Not a secret: guard
/// names and sender classes; the proof is what makes it the agent's to believe.
async fn own_denials(
    State(st): State<Arc<AppState>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let nonce = query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("nonce="))
        .and_then(hcp_fleet_guards::probe::a_nonce);
    let Some(nonce) = nonce else {
        return (StatusCode::BAD_REQUEST, "want ?nonce=<hex, at most 64>").into_response();
    };
    let Some(key) = st.probe_key().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no probe key yet").into_response();
    };
    let denied = st.own_denials.report(Instant::now());
    hcp_fleet_guards::probe::own_denials(&key, nonce, &denied).into_response()
}

/// While draining, an HTTP/1.1 answer carries `Connection: close`: the client learns with the
/// answer that the connection is done, rather than finding it closed under its next request.
/// (HTTP/2 needs nothing: the drain's GOAWAY tells the client the same.)
async fn close_while_draining(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let version = req.version();
    let mut resp = next.run(req).await;
    close_while_draining_on(&st, version, &mut resp);
    resp
}

/// `Connection: close` on an HTTP/1.1 answer while draining (`close_while_draining`, and each
/// review's own answer in `admit`).
fn close_while_draining_on(st: &AppState, version: http::Version, resp: &mut Response) {
    if version <= http::Version::HTTP_11 && st.draining.load(Ordering::Relaxed) {
        resp.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
}

/// The threads that serve connections: one single-threaded runtime each. A connection stays
/// on the thread it was handed to, so a request is read, decided and answered where its
/// bytes arrived. On a shared multi-threaded runtime the wake-ups between worker threads
/// (futex and epoll calls) were about 40 % of the CPU of a single connection's requests
/// (`make bench`, profiled with perf): a kube-apiserver calls a webhook over a few
/// keep-alive connections, so that is the common case.
struct Workers {
    handles: Vec<tokio::runtime::Handle>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    next: usize,
}

impl Workers {
    /// `n` threads (at least one), each spinning up to `spin` before it sleeps, or an error
    /// if a runtime cannot be built.
    fn start(n: usize, spin: Duration) -> std::io::Result<Workers> {
        let mut w = Workers {
            handles: Vec::new(),
            stops: Vec::new(),
            threads: Vec::new(),
            next: 0,
        };
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .on_thread_park(move || spin::before_park(spin))
                .build()?;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            w.handles.push(rt.handle().clone());
            w.stops.push(stop);
            w.threads.push(
                std::thread::Builder::new()
                    .name(format!("admission-{i}"))
                    .spawn(move || {
                        let _ = rt.block_on(stopped);
                    })?,
            );
        }
        Ok(w)
    }

    /// The next thread's runtime, in turn.
    fn pick(&mut self) -> &tokio::runtime::Handle {
        let i = self.next % self.handles.len();
        self.next = self.next.wrapping_add(1);
        &self.handles[i]
    }

    fn stop(self) {
        drop(self.stops);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Spin before sleeping: a connection thread about to park watches its own connections'
/// sockets for a short while, so the next request on a busy keep-alive connection finds the
/// thread running instead of asleep.
///
/// A one-connection client (a kube-apiserver's usual way) sends its next request tens of
/// microseconds after the last answer. Parked, the thread pays the kernel's wake-up path for
/// each one (switched out, then in again on an interrupt): perf put the scheduler's switch-in
/// and the wake-up's lock at about half of a one-connection run's CPU (`make bench`). Spinning
/// in `on_thread_park` leaves tokio's readiness untouched: the spin only returns early when a
/// socket has bytes (a `poll` with no timeout, which reads nothing), and tokio's own
/// `epoll_wait` then finds the event without sleeping. A thread spins only right after it
/// answered a review, and not after a spin that caught nothing until reviews follow their
/// answers closely again (`began`, `wasted`): idle connections and a slow client cost one spin
/// at most; a thread with many connections never runs out of work long enough to spin, and
/// does not look at more than `MAX_WATCHED` of them.
mod spin {
    use std::cell::{Cell, RefCell};
    use std::os::fd::{AsRawFd, RawFd};
    use std::time::{Duration, Instant};

    /// Past this many connections on one thread the spin is skipped: such a thread is busy.
    pub(crate) const MAX_WATCHED: usize = 16;

    thread_local! {
        static WATCHED: RefCell<Vec<RawFd>> = const { RefCell::new(Vec::new()) };
        /// When this thread last answered a review, and whether spinning pays here: off
        /// once a spin ran its whole length for nothing, on again when a review follows its
        /// answer closely (`began`).
        static PACE: Cell<(Option<Instant>, bool)> = const { Cell::new((None, true)) };
    }

    /// How closely a review must follow the answer before it (as a multiple of the spin) to
    /// turn the spin back on: a client that sends its next review at once, measured from
    /// before the answer was written to after the next review was read (about 80 µs here
    /// without a spin).
    const CLOSE_FOLLOW: u32 = 4;

    /// A review begins on this thread. One that follows its answer closely (a closed loop, a
    /// burst) turns the spin on; a spin that then runs out for nothing turns it off
    /// (`before_park`). So a client that sends a review now and then (a kube-apiserver at a
    /// low rate) costs one spin at most, and an idle service never spins.
    pub(crate) fn began(spin: Duration) {
        PACE.with(|p| {
            let (answered, pays) = p.get();
            let close = answered.is_some_and(|at| at.elapsed() < spin * CLOSE_FOLLOW);
            p.set((answered, pays || close));
        });
    }

    /// A spin ran its whole length for nothing: no more until a review follows its answer
    /// closely.
    fn wasted() {
        PACE.with(|p| {
            let (answered, _) = p.get();
            p.set((answered, false));
        });
    }

    /// A review answered on this thread.
    pub(crate) fn answered() {
        PACE.with(|p| {
            let (_, pays) = p.get();
            p.set((Some(Instant::now()), pays));
        });
    }

    /// Whether this thread, about to park, should spin: it answered a review within the last
    /// `spin`, and spinning is on (`began` turns it on, `wasted` off).
    fn worth_it(spin: Duration) -> bool {
        PACE.with(|p| match p.get() {
            (Some(at), pays) => pays && at.elapsed() < spin,
            (None, _) => false,
        })
    }

    /// One connection's socket watched by the spin of the thread that serves it, for as long
    /// as this lives (it is made, and dropped, on that thread).
    pub(crate) struct Watched(RawFd);

    impl Watched {
        pub(crate) fn new(socket: &impl AsRawFd) -> Self {
            let fd = socket.as_raw_fd();
            WATCHED.with(|w| w.borrow_mut().push(fd));
            Watched(fd)
        }
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            WATCHED.with(|w| {
                let mut w = w.borrow_mut();
                if let Some(i) = w.iter().position(|fd| *fd == self.0) {
                    w.swap_remove(i);
                }
            });
        }
    }

    /// Spins until one of this thread's sockets is readable (or closed), or `spin` passes.
    pub(crate) fn before_park(spin: Duration) {
        if spin.is_zero() || !worth_it(spin) {
            return;
        }
        // On the stack: this runs every time the thread is about to sleep.
        let empty = libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        };
        let mut fds = [empty; MAX_WATCHED];
        let n = WATCHED.with(|w| {
            let w = w.borrow();
            if w.len() > MAX_WATCHED {
                return 0;
            }
            for (slot, fd) in fds.iter_mut().zip(w.iter()) {
                *slot = libc::pollfd {
                    fd: *fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
            }
            w.len()
        });
        if n == 0 {
            return;
        }
        let until = Instant::now() + spin;
        while Instant::now() < until {
            // SAFETY: `fds` is a live, exclusively borrowed array of at least `n` pollfd
            // structs, and a zero timeout returns at once; poll reads nothing from the
            // sockets and reports a descriptor closed meanwhile as POLLNVAL, not an error.
            #[allow(unsafe_code)]
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, 0) };
            if ready != 0 {
                return;
            }
            std::hint::spin_loop();
        }
        wasted();
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::io::Write;

        /// The spin ends as soon as a watched socket has bytes, runs its whole length when
        /// none has, and is skipped where nothing is watched; a watch ends with its guard.
        #[test]
        fn the_spin_ends_when_a_watched_socket_is_readable() {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let mut client = std::net::TcpStream::connect(listener.local_addr().expect("addr"))
                .expect("connect");
            let (server, _) = listener.accept().expect("accept");
            let long = Duration::from_secs(5);

            let started = Instant::now();
            before_park(long);
            assert!(started.elapsed() < long, "nothing watched: no spin");

            let watched = Watched::new(&server);
            answered();
            let started = Instant::now();
            before_park(Duration::from_millis(30));
            assert!(
                started.elapsed() >= Duration::from_millis(30),
                "a quiet socket: the whole spin"
            );

            client.write_all(b"x").expect("write");
            // The quiet spin turned spinning off; a review right after its answer turns it on.
            assert!(!worth_it(long));
            began(long);
            answered();
            assert!(worth_it(long));
            let started = Instant::now();
            before_park(long);
            assert!(started.elapsed() < long, "a readable socket ends the spin");

            drop(watched);
            assert!(WATCHED.with(|w| w.borrow().is_empty()));
        }

        /// A thread spins only right after an answer, and only while reviews come within a
        /// spin of the answer before them: not at rest, not for a client that sends now and
        /// then.
        #[test]
        fn the_spin_goes_only_where_it_pays() {
            let long = Duration::from_secs(10);
            let short = Duration::from_millis(5);
            assert!(!worth_it(long), "nothing answered yet");
            answered();
            assert!(worth_it(long), "just answered");
            std::thread::sleep(short * 2);
            assert!(!worth_it(short), "long after the answer: a wake-up at rest");
            // A spin that runs out: off, and a review long after its answer leaves it off.
            wasted();
            answered();
            assert!(!worth_it(long), "a spin that caught nothing");
            std::thread::sleep(short * (CLOSE_FOLLOW + 1));
            began(short);
            answered();
            assert!(!worth_it(long), "a slow client: no spin");
            began(long);
            answered();
            assert!(
                worth_it(long),
                "a review right after the answer: spinning again"
            );
        }
    }
}

/// How many connection threads: one per CPU the process may use.
fn worker_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// A future boxed at this crate's boundary: `serve`'s `shutdown`, and what it returns.
pub type Boxed = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then drains. Connections
/// are accepted here and served on `Workers`' threads.
///
/// Boxed, and `shutdown` a box, so that nothing here is generic and the server is compiled in
/// this crate only (rustc compiles an `async fn`'s body in every crate that polls its future;
/// see `hcp_fleet_agent::controller::run`).
pub fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    limits: Limits,
    shutdown: Boxed,
) -> Boxed {
    Box::pin(serving(listener, tls, app, limits, shutdown))
}

async fn serving(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: axum::Router,
    limits: Limits,
    mut shutdown: Boxed,
) {
    let mut workers = match Workers::start(worker_count(), limits.spin) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the connection threads");
            return;
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(limits.h2_keep_alive))
        .keep_alive_timeout(limits.h2_keep_alive / 2);
    let builder = Arc::new(builder);
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        tokio::select! {
            conn = listener.accept() => {
                let (tcp, _) = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                // Over the limit: closed at once (the API server retries on another
                // connection, or its failurePolicy decides).
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::debug!(limit = limits.max_connections, "connection limit reached; closing a new connection");
                    drop(tcp);
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                // Registered with this runtime's reactor: handed over as a plain socket and
                // registered again on the thread that serves it.
                let tcp = match tcp.into_std() {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!(error = %e, "handing a connection over failed");
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let svc = TowerToHyperService::new(app.clone());
                let builder = builder.clone();
                let watcher = graceful.watcher();
                let handshake = limits.handshake;
                workers.pick().spawn(async move {
                    let _slot = slot;
                    let _spin = spin::Watched::new(&tcp);
                    let Ok(tcp) = tokio::net::TcpStream::from_std(tcp) else {
                        return;
                    };
                    let tls = match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                        Ok(Ok(t)) => t,
                        _ => return,
                    };
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc).into_owned();
                    let _ = watcher.watch(conn).await;
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(limits.drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain period; closing");
    }
    // Off the async thread: joining waits for each connection thread to finish its stop.
    let _ = tokio::task::spawn_blocking(move || workers.stop()).await;
}

/// A rustls server config that asks `resolver` at every handshake.
pub fn tls_config(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
) -> Arc<rustls::ServerConfig> {
    let mut cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// A `--bind` and `--port` that make no socket address.
#[derive(Debug, thiserror::Error)]
#[error("{bind}:{port}: {source}")]
pub struct BadAddress {
    bind: String,
    port: u16,
    #[source]
    source: std::net::AddrParseError,
}

/// What `webhook` serves on; for tests and `dev`, which bind loopback.
pub fn bind_addr(port: u16, bind: &str) -> Result<SocketAddr, BadAddress> {
    format!("{bind}:{port}")
        .parse()
        .map_err(|source| BadAddress {
            bind: bind.to_string(),
            port,
            source,
        })
}

#[cfg(test)]
mod hook_tests {
    use super::*;

    #[test]
    fn a_hooks_denials_land_in_their_senders_series_as_the_long_way_counts_them() {
        let m = AdmissionMetrics::new();
        let hook = Hook {
            name: "w.example.io".into(),
            guard: None,
            latency: Default::default(),
            counts: Default::default(),
            denials: Default::default(),
        };
        hook.count_denial(&m, "tenant");
        hook.count_denial(&m, "node");
        hook.count_denial(&m, "tenant");
        // The same series the label set reaches: one more through it.
        m.count_denial("w.example.io", "tenant");
        let text = m.encode();
        let value = |sender: &str| {
            let series = format!(
                "hcp_fleet_admission_denials_total{{webhook=\"w.example.io\",sender=\"{sender}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        assert_eq!(value("tenant"), Some(3), "{text}");
        assert_eq!(value("node"), Some(1), "{text}");
        assert_eq!(hook.denials.read().map(|d| d.len()).unwrap_or(0), 2);
    }

    /// The service's state as the agent's default configuration makes it, no probe key.
    fn default_state() -> Arc<AppState> {
        let settings =
            hcp_fleet_guards::Settings::from(&hcp_fleet_render::config::AgentConfig::default());
        AppState::new(settings, Limits::default(), None)
    }

    /// A request of `method` to `path` with a JSON `body`, as the router receives it.
    fn json(method: &str, path: &str, body: String) -> axum::http::Request<axum::body::Body> {
        axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body))
            .expect("request")
    }

    /// A review's answer says `Connection: close` itself, the other routes' through the
    /// middleware: while draining, every HTTP/1.1 answer does, and none before.
    #[tokio::test]
    async fn while_draining_every_http1_answer_says_close() {
        use tower::ServiceExt;
        let st = default_state();
        let app = router(st.clone());
        let review = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "operation": "DELETE", "name": "cluster-admin",
                "kind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole"},
                "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": "clusterroles"},
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            }
        })
        .to_string();
        for draining in [false, true] {
            st.draining.store(draining, Ordering::Relaxed);
            for (method, path, body, status) in [
                (
                    "POST",
                    "/validate/protected-rbac",
                    review.clone(),
                    StatusCode::OK,
                ),
                (
                    "POST",
                    "/validate/protected-rbac",
                    "{".into(),
                    StatusCode::BAD_REQUEST,
                ),
                ("GET", "/healthz", String::new(), StatusCode::OK),
            ] {
                let resp = app
                    .clone()
                    .oneshot(json(method, path, body))
                    .await
                    .expect("answer");
                assert_eq!(resp.status(), status, "{method} {path}");
                let close = resp
                    .headers()
                    .get(header::CONNECTION)
                    .is_some_and(|v| v == "close");
                assert_eq!(close, draining, "{method} {path}, draining: {draining}");
            }
        }
    }

    /// An object no tree can hold (nested past serde_json's limit) is a malformed review
    /// where a guard reads it (400, as every such review was before objects were read
    /// lazily), and no matter where the guard needs only its name.
    #[tokio::test]
    async fn an_unreadable_object_is_a_bad_request_only_where_a_guard_reads_it() {
        use tower::ServiceExt;
        let app = router(default_state());
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let review = |op: &str, group: &str, resource: &str, field: &str, object: &str| {
            format!(
                r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{"uid": "u", "operation": "{op}", "name": "cluster-admin", "kind": {{"group": "{group}", "version": "v1", "kind": "X"}}, "resource": {{"group": "{group}", "version": "v1", "resource": "{resource}"}}, "userInfo": {{"username": "alice", "groups": ["system:authenticated"]}}, "{field}": {object}}}}}"#
            )
        };
        let service = format!(
            r#"{{"metadata": {{"name": "s"}}, "spec": {{"type": "LoadBalancer", "x": {deep}}}}}"#
        );
        let role = format!(r#"{{"metadata": {{"name": "cluster-admin"}}, "rules": {deep}}}"#);
        for (path, body, status, says) in [
            (
                "/mutate/service-tags",
                review("CREATE", "", "services", "object", &service),
                StatusCode::BAD_REQUEST,
                "an object cannot be read",
            ),
            (
                "/validate/protected-rbac",
                review(
                    "DELETE",
                    "rbac.authorization.k8s.io",
                    "clusterroles",
                    "oldObject",
                    &role,
                ),
                StatusCode::OK,
                "\"allowed\":false",
            ),
        ] {
            let resp = app
                .clone()
                .oneshot(json("POST", path, body))
                .await
                .expect("answer");
            assert_eq!(resp.status(), status, "{path}");
            let text = axum::body::to_bytes(resp.into_body(), MAX_BODY_BYTES)
                .await
                .expect("body");
            let text = String::from_utf8_lossy(&text);
            assert!(text.contains(says), "{path}: {text}");
        }
    }
}
