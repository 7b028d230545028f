//! SIMULATED hosted clusters for the scale benchmark (`bench_scale.rs`), and nothing else:
//! a thousand real hosted kube-apiservers do not fit on one machine (each needs about 300 MB),
//! so one HTTPS server in the bench process plays all but a handful of them. Every figure
//! that comes from these clusters is printed as simulated.
//!
//! What each simulated cluster serves, to the agent's own client over real TLS (its own CA;
//! the cluster is told apart by the SNI name its kubeconfig's `tls-server-name` sends, and its
//! bearer token is checked):
//! - `/version`, discovery of `admissionregistration.k8s.io/v1` (as 1.36 lists it), and the
//!   `kube-system` Namespace (a UID of its own: the agent's identity check);
//! - the four admission kinds the agent manages (webhook configurations of both kinds,
//!   ValidatingAdmissionPolicies and their bindings): get, list (labelSelector, fieldSelector
//!   on the name, metadata-only), watch (from a resourceVersion, with bookmarks, ended at
//!   `timeoutSeconds`; a resourceVersion older than the last 64 events is 410 Gone), server-side
//!   apply (the agent is the only field manager here, so an apply replaces the object; a no-op
//!   apply changes nothing and tells no watcher), create (with dry run, which answers the
//!   agent's matchConditions feature question as 1.36 does), JSON merge patch, and delete;
//! - the probe: a dry-run ConfigMap create is denied with the admission service's answer when
//!   an installed webhook's objectSelector selects its labels (as the real service answers it),
//!   and with the probe policy's message when an installed binding and its policy select them.
//!   There is no policy compile delay (a real server takes up to a second). The webhook's
//!   answer carries the proof of the probe's nonce under the HCP's probe key, which the
//!   simulated pods read from the HCP's TLS Secret as the real service reads its mounted copy.
//!
//! Requests are counted per cluster, so the agent's own counters can be checked.

pub mod kubelet;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use base64::Engine as _;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde_json::{Value, json};

use hcp_fleet_guards::catalogue::PROBE_LABEL;
use hcp_fleet_guards::probe::{NONCE_ANNOTATION, ProbeKey, answer};
use hcp_fleet_render::certificates::{Usage, generate_ca, issue};
use hcp_fleet_render::hosted::objects::CLAIM_ANNOTATION;

/// Events kept per cluster for watches that resume from a resourceVersion.
const EVENT_LOG: usize = 64;
/// How often an idle watch gets a bookmark (a real kube-apiserver sends one about a minute).
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

/// The admission kinds a simulated cluster stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Vwc,
    Mwc,
    Vap,
    Vapb,
    Map,
    Mapb,
}

impl Kind {
    /// A simulated cluster serves what a 1.36 kube-apiserver does: the webhook
    /// configurations and both kinds of admission policy (MutatingAdmissionPolicy GA).
    pub const ALL: [Kind; 6] = [
        Kind::Vwc,
        Kind::Mwc,
        Kind::Vap,
        Kind::Vapb,
        Kind::Map,
        Kind::Mapb,
    ];

    pub fn plural(self) -> &'static str {
        match self {
            Kind::Vwc => "validatingwebhookconfigurations",
            Kind::Mwc => "mutatingwebhookconfigurations",
            Kind::Vap => "validatingadmissionpolicies",
            Kind::Vapb => "validatingadmissionpolicybindings",
            Kind::Map => "mutatingadmissionpolicies",
            Kind::Mapb => "mutatingadmissionpolicybindings",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Kind::Vwc => "ValidatingWebhookConfiguration",
            Kind::Mwc => "MutatingWebhookConfiguration",
            Kind::Vap => "ValidatingAdmissionPolicy",
            Kind::Vapb => "ValidatingAdmissionPolicyBinding",
            Kind::Map => "MutatingAdmissionPolicy",
            Kind::Mapb => "MutatingAdmissionPolicyBinding",
        }
    }

    fn from_plural(p: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.plural() == p)
    }
}

/// Requests one simulated cluster received.
#[derive(Default)]
pub struct Requests {
    total: AtomicU64,
    /// Each request by method, path and whether it watches, for one cluster of the fleet (the
    /// first): what the agent asks of a hosted cluster, at no cost to the others.
    calls: Option<Mutex<BTreeMap<String, u64>>>,
}

impl Requests {
    fn count(&self, call: impl FnOnce() -> String) {
        self.total.fetch_add(1, Ordering::Relaxed);
        if let Some(calls) = &self.calls
            && let Ok(mut m) = calls.lock()
        {
            *m.entry(call()).or_default() += 1;
        }
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The requests by call so far, where this cluster keeps them.
    pub fn calls(&self) -> Option<BTreeMap<String, u64>> {
        self.calls
            .as_ref()
            .and_then(|m| m.lock().ok().map(|m| m.clone()))
    }
}

struct WatchSub {
    kind: Kind,
    selector: Selector,
    tx: tokio::sync::mpsc::UnboundedSender<Bytes>,
}

struct Event {
    rv: u64,
    kind: Kind,
    old: Option<Arc<Value>>,
    new: Option<Arc<Value>>,
}

#[derive(Default)]
struct Store {
    rv: u64,
    objects: BTreeMap<(Kind, String), Arc<Value>>,
    log: VecDeque<Event>,
    subs: Vec<WatchSub>,
    /// When the API last wrote each object (the agent is the only client that writes).
    written: HashMap<(Kind, String), Instant>,
}

/// The probe key of each simulated HCP namespace, as the simulated pods read it.
pub type ProbeKeys = Arc<Mutex<HashMap<String, ProbeKey>>>;

/// One simulated hosted cluster.
pub struct SimCluster {
    pub name: String,
    pub kubeconfig: String,
    token: String,
    uid: String,
    store: Mutex<Store>,
    pub requests: Requests,
    probe_keys: ProbeKeys,
}

impl SimCluster {
    fn store(&self) -> MutexGuard<'_, Store> {
        match self.store.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The objects of `kind` held now.
    pub fn objects(&self, kind: Kind) -> Vec<Arc<Value>> {
        self.store()
            .objects
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn object(&self, kind: Kind, name: &str) -> Option<Arc<Value>> {
        self.store().objects.get(&(kind, name.to_string())).cloned()
    }

    /// When the API last wrote `name`.
    pub fn written_at(&self, kind: Kind, name: &str) -> Option<Instant> {
        self.store().written.get(&(kind, name.to_string())).copied()
    }

    /// Someone other than the agent edits (`Some`) or deletes (`None`) an object; its
    /// watchers are told at once. Returns when it happened.
    pub fn tamper(&self, kind: Kind, name: &str, edit: Option<&dyn Fn(&mut Value)>) -> Instant {
        let mut s = self.store();
        let key = (kind, name.to_string());
        let old = s.objects.get(&key).cloned();
        let new = match (edit, &old) {
            (Some(f), Some(o)) => {
                let mut v = (**o).clone();
                f(&mut v);
                Some(v)
            }
            _ => None,
        };
        commit(&mut s, kind, name, old, new);
        Instant::now()
    }

    /// Everything stored, gone (between benchmark sizes, after `uninstall`).
    pub fn object_count(&self) -> usize {
        self.store().objects.len()
    }
}

/// Writes `new` (or deletes, with `None`) under a fresh resourceVersion and tells watchers.
fn commit(
    s: &mut Store,
    kind: Kind,
    name: &str,
    old: Option<Arc<Value>>,
    new: Option<Value>,
) -> Option<Arc<Value>> {
    s.rv += 1;
    let rv = s.rv;
    let key = (kind, name.to_string());
    let new = new.map(|mut v| {
        v["metadata"]["resourceVersion"] = json!(rv.to_string());
        Arc::new(v)
    });
    match &new {
        Some(v) => {
            s.objects.insert(key, v.clone());
        }
        None => {
            s.objects.remove(&key);
        }
    }
    let ev = Event {
        rv,
        kind,
        old: old.map(|o| {
            // A deleted object is reported with the deletion's resourceVersion.
            let mut v = (*o).clone();
            v["metadata"]["resourceVersion"] = json!(rv.to_string());
            Arc::new(v)
        }),
        new: new.clone(),
    };
    s.subs.retain(|w| match line_for(w.kind, &w.selector, &ev) {
        Some(line) => w.tx.send(line).is_ok(),
        None => !w.tx.is_closed(),
    });
    s.log.push_back(ev);
    while s.log.len() > EVENT_LOG {
        s.log.pop_front();
    }
    new
}

/// The watch line `ev` is for a watcher of `kind` with `selector`, if any: an object that
/// starts matching is ADDED, stops matching DELETED.
fn line_for(kind: Kind, selector: &Selector, ev: &Event) -> Option<Bytes> {
    if ev.kind != kind {
        return None;
    }
    let was = ev.old.as_ref().filter(|o| selector.matches(o));
    let is = ev.new.as_ref().filter(|o| selector.matches(o));
    let (ty, obj) = match (was, is) {
        (None, Some(n)) => ("ADDED", n),
        (Some(_), Some(n)) => ("MODIFIED", n),
        (Some(o), None) => ("DELETED", o),
        (None, None) => return None,
    };
    let mut line = serde_json::to_vec(&json!({"type": ty, "object": obj.as_ref()})).ok()?;
    line.push(b'\n');
    Some(Bytes::from(line))
}

/// A label selector as the agent sends them: `k=v`, `k==v`, `k!=v`, `k`, `!k`, and
/// `metadata.name=` as a field selector.
#[derive(Debug, Clone, Default)]
struct Selector {
    labels: Vec<(String, Op)>,
    name: Option<String>,
}

#[derive(Debug, Clone)]
enum Op {
    Eq(String),
    Ne(String),
    Exists,
    Absent,
}

impl Selector {
    fn parse(labels: &str, fields: &str) -> Self {
        let mut sel = Selector::default();
        for term in labels.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let op = if let Some((k, v)) = term.split_once("!=") {
                (k, Op::Ne(v.into()))
            } else if let Some((k, v)) = term.split_once("==") {
                (k, Op::Eq(v.into()))
            } else if let Some((k, v)) = term.split_once('=') {
                (k, Op::Eq(v.into()))
            } else if let Some(k) = term.strip_prefix('!') {
                (k, Op::Absent)
            } else {
                (term, Op::Exists)
            };
            sel.labels.push((op.0.trim().to_string(), op.1));
        }
        for term in fields.split(',') {
            if let Some(n) = term
                .strip_prefix("metadata.name==")
                .or_else(|| term.strip_prefix("metadata.name="))
            {
                sel.name = Some(n.to_string());
            }
        }
        sel
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(n) = &self.name
            && obj["metadata"]["name"].as_str() != Some(n)
        {
            return false;
        }
        let labels = &obj["metadata"]["labels"];
        self.labels.iter().all(|(k, op)| {
            let v = labels.get(k).and_then(Value::as_str);
            match op {
                Op::Eq(want) => v == Some(want),
                Op::Ne(want) => v != Some(want),
                Op::Exists => v.is_some(),
                Op::Absent => v.is_none(),
            }
        })
    }
}

fn query_map(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Percent-decoding of a query component (`+` as a space).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(c) => {
                        out.push(c);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    json_response(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        }),
    )
}

/// A Forbidden status for a core-group object, as apimachinery's `NewForbidden` makes it.
fn forbidden(resource: &str, name: &str, why: &str) -> Response<Body> {
    json_response(
        StatusCode::FORBIDDEN,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": format!("{resource} \"{name}\" is forbidden: {why}"),
            "reason": "Forbidden", "details": {"name": name, "kind": resource}, "code": 403,
        }),
    )
}

fn metadata_only(obj: &Value) -> Value {
    json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": obj["metadata"],
    })
}

fn with_type(kind: Kind, mut obj: Value) -> Value {
    obj["apiVersion"] = json!("admissionregistration.k8s.io/v1");
    obj["kind"] = json!(kind.kind());
    obj
}

/// RFC 7386.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Whether `sel.matchLabels` is non-empty and every label of it is in `labels`.
fn selects(sel: &Value, labels: &Value) -> bool {
    sel["matchLabels"]
        .as_object()
        .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

impl SimCluster {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = query_map(req.uri().query().unwrap_or(""));
        let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
        self.requests.count(|| {
            let shown = if watch { " (watch)" } else { "" };
            format!("{method}{shown} {path}")
        });
        let authorized = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| h == format!("Bearer {}", self.token));
        if !authorized {
            return status(401, "Unauthorized", "Unauthorized");
        }
        let meta_only = req
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return status(400, "BadRequest", &format!("reading the body: {e}")),
        };
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        match (method.clone(), parts.as_slice()) {
            (Method::GET, ["version"]) => json_response(
                StatusCode::OK,
                &json!({"major": "1", "minor": "36", "gitVersion": "v1.36.2-simulated", "platform": "linux/amd64"}),
            ),
            (Method::GET, ["api", "v1", "namespaces", "kube-system"]) => json_response(
                StatusCode::OK,
                &json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": "kube-system", "uid": self.uid, "resourceVersion": "1"}}),
            ),
            (Method::GET, ["apis", "admissionregistration.k8s.io", "v1"]) => {
                let resources: Vec<Value> = Kind::ALL
                    .iter()
                    .map(|k| json!({
                        "name": k.plural(), "singularName": "", "namespaced": false,
                        "kind": k.kind(),
                        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                    }))
                    .collect();
                json_response(
                    StatusCode::OK,
                    &json!({"kind": "APIResourceList", "apiVersion": "v1",
                            "groupVersion": "admissionregistration.k8s.io/v1", "resources": resources}),
                )
            }
            (Method::POST, ["api", "v1", "namespaces", ns, "configmaps"]) => {
                self.create_configmap(ns, &body)
            }
            (
                m,
                [
                    "apis",
                    "admissionregistration.k8s.io",
                    "v1",
                    plural,
                    rest @ ..,
                ],
            ) => {
                let Some(kind) = Kind::from_plural(plural) else {
                    return status(
                        404,
                        "NotFound",
                        "the server could not find the requested resource",
                    );
                };
                match (m, rest) {
                    (Method::GET, []) if watch => self.watch(kind, &query),
                    (Method::GET, []) => self.list(kind, &query, meta_only),
                    (Method::GET, [name]) => match self.object(kind, name) {
                        Some(o) if meta_only => json_response(StatusCode::OK, &metadata_only(&o)),
                        Some(o) => json_response(StatusCode::OK, &o),
                        None => not_found(kind, name),
                    },
                    (Method::POST, []) => self.create(kind, &query, &body),
                    (Method::PATCH, [name]) => self.patch(kind, name, &body),
                    (Method::PUT, [name]) => self.replace(kind, name, &body),
                    (Method::DELETE, [name]) => {
                        let mut s = self.store();
                        let key = (kind, name.to_string());
                        match s.objects.get(&key).cloned() {
                            Some(old) => {
                                s.written.insert(key, Instant::now());
                                let gone = (*old).clone();
                                commit(&mut s, kind, name, Some(old), None);
                                json_response(StatusCode::OK, &gone)
                            }
                            None => not_found(kind, name),
                        }
                    }
                    _ => status(405, "MethodNotAllowed", "not supported by the simulation"),
                }
            }
            _ => status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        }
    }

    fn list(&self, kind: Kind, q: &HashMap<String, String>, meta_only: bool) -> Response<Body> {
        let sel = Selector::parse(
            q.get("labelSelector").map_or("", String::as_str),
            q.get("fieldSelector").map_or("", String::as_str),
        );
        let s = self.store();
        let items: Vec<Value> = s
            .objects
            .iter()
            .filter(|((k, _), o)| *k == kind && sel.matches(o))
            .map(|(_, o)| {
                if meta_only {
                    metadata_only(o)
                } else {
                    (**o).clone()
                }
            })
            .collect();
        let (api_version, list_kind) = if meta_only {
            (
                "meta.k8s.io/v1".to_string(),
                "PartialObjectMetadataList".to_string(),
            )
        } else {
            (
                "admissionregistration.k8s.io/v1".to_string(),
                format!("{}List", kind.kind()),
            )
        };
        json_response(
            StatusCode::OK,
            &json!({"apiVersion": api_version, "kind": list_kind,
                    "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
        )
    }

    fn watch(self: &Arc<Self>, kind: Kind, q: &HashMap<String, String>) -> Response<Body> {
        let sel = Selector::parse(
            q.get("labelSelector").map_or("", String::as_str),
            q.get("fieldSelector").map_or("", String::as_str),
        );
        let from: u64 = q
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let timeout = Duration::from_secs(
            q.get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1800),
        );
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        {
            let mut s = self.store();
            let oldest = s.log.front().map_or(s.rv + 1, |e| e.rv);
            if from > 0 && from + 1 < oldest {
                let gone = json!({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {from} ({})", oldest - 1),
                    "reason": "Expired", "code": 410}});
                let mut line = gone.to_string().into_bytes();
                line.push(b'\n');
                let _ = tx.send(Bytes::from(line));
            } else {
                let replay: Vec<Bytes> = s
                    .log
                    .iter()
                    .filter(|e| e.rv > from)
                    .filter_map(|e| line_for(kind, &sel, e))
                    .collect();
                for l in replay {
                    let _ = tx.send(l);
                }
                s.subs.push(WatchSub {
                    kind,
                    selector: sel,
                    tx,
                });
            }
        }
        let me = self.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stream =
            futures::stream::unfold((rx, tick, me), move |(mut rx, mut tick, me)| async move {
                let item = tokio::select! {
                    m = rx.recv() => m,
                    _ = tokio::time::sleep_until(deadline) => None,
                    _ = tick.tick(), if bookmarks => {
                        let rv = me.store().rv;
                        let b = json!({"type": "BOOKMARK", "object": {
                            "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind.kind(),
                            "metadata": {"resourceVersion": rv.to_string()}}});
                        let mut line = b.to_string().into_bytes();
                        line.push(b'\n');
                        Some(Bytes::from(line))
                    }
                };
                item.map(|b| (Ok::<_, std::io::Error>(b), (rx, tick, me)))
            });
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        r
    }

    fn create(&self, kind: Kind, q: &HashMap<String, String>, body: &Bytes) -> Response<Body> {
        let Ok(obj) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the body is not JSON");
        };
        let Some(name) = obj["metadata"]["name"].as_str().map(str::to_string) else {
            return status(422, "Invalid", "metadata.name: Required value");
        };
        let dry_run = q.get("dryRun").is_some_and(|d| d == "All");
        let mut s = self.store();
        if s.objects.contains_key(&(kind, name.clone())) {
            return status(
                409,
                "AlreadyExists",
                &format!("{} \"{name}\" already exists", kind.plural()),
            );
        }
        let mut obj = with_type(kind, obj);
        obj["metadata"]["uid"] = json!(format!("{}-{}", kind.plural(), s.rv + 1));
        obj["metadata"]["generation"] = json!(1);
        obj["metadata"]["creationTimestamp"] = json!("2026-11-23T00:00:00Z");
        if dry_run {
            return json_response(StatusCode::CREATED, &obj);
        }
        s.written.insert((kind, name.clone()), Instant::now());
        let stored = commit(&mut s, kind, &name, None, Some(obj));
        json_response(
            StatusCode::CREATED,
            stored.as_deref().unwrap_or(&Value::Null),
        )
    }

    /// A replace (PUT): the whole object, at the resourceVersion it names (a conflict where
    /// the stored one is another), as a real server takes it; the agent repairs its hosted
    /// objects so.
    fn replace(&self, kind: Kind, name: &str, body: &Bytes) -> Response<Body> {
        let Ok(mut whole) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the body is not JSON");
        };
        match self.object(kind, name) {
            None => return not_found(kind, name),
            Some(o) => {
                let asked = whole["metadata"]["resourceVersion"].as_str();
                if asked.is_some_and(|rv| o["metadata"]["resourceVersion"].as_str() != Some(rv)) {
                    return status(
                        409,
                        "Conflict",
                        "the object has been modified; please apply your changes to the latest version and try again",
                    );
                }
            }
        }
        // The whole object, as an apply of it is taken here.
        whole = with_type(kind, whole);
        let body = Bytes::from(serde_json::to_vec(&whole).unwrap_or_default());
        self.patch(kind, name, &body)
    }

    fn patch(&self, kind: Kind, name: &str, body: &Bytes) -> Response<Body> {
        let Ok(patch) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the patch is not JSON");
        };
        let mut s = self.store();
        let key = (kind, name.to_string());
        let old = s.objects.get(&key).cloned();
        // Server-side apply by the only field manager, or a merge patch: either way the
        // object the patch describes on top of what is there (apply: replaces it).
        let is_apply = patch["apiVersion"].is_string() && patch["kind"].is_string();
        let mut new = match (&old, is_apply) {
            (_, true) => patch.clone(),
            (Some(o), false) => {
                let mut v = (**o).clone();
                merge_patch(&mut v, &patch);
                v
            }
            (None, false) => return not_found(kind, name),
        };
        new = with_type(kind, new);
        new["metadata"]["name"] = json!(name);
        let same_spec = |a: &Value, b: &Value| {
            let strip = |v: &Value| {
                let mut v = v.clone();
                if let Some(m) = v["metadata"].as_object_mut() {
                    for k in [
                        "resourceVersion",
                        "uid",
                        "generation",
                        "creationTimestamp",
                        "managedFields",
                    ] {
                        m.remove(k);
                    }
                }
                v
            };
            strip(a) == strip(b)
        };
        match &old {
            Some(o) => {
                for k in ["uid", "creationTimestamp", "generation"] {
                    new["metadata"][k] = o["metadata"][k].clone();
                }
                if same_spec(o, &new) {
                    return json_response(StatusCode::OK, o);
                }
                let g = o["metadata"]["generation"].as_i64().unwrap_or(1);
                new["metadata"]["generation"] = json!(g + 1);
            }
            None => {
                new["metadata"]["uid"] = json!(format!("{}-{}", kind.plural(), s.rv + 1));
                new["metadata"]["generation"] = json!(1);
                new["metadata"]["creationTimestamp"] = json!("2026-11-23T00:00:00Z");
            }
        }
        let created = old.is_none();
        s.written.insert(key, Instant::now());
        let stored = commit(&mut s, kind, name, old, Some(new));
        json_response(
            if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            stored.as_deref().unwrap_or(&Value::Null),
        )
    }

    /// The probe, answered as the admission service (a webhook whose objectSelector selects
    /// the labels) or as the API server running the probe policy (a binding and its policy
    /// selecting them) would; anything else is created (dry run).
    fn create_configmap(&self, ns: &str, body: &Bytes) -> Response<Body> {
        let Ok(mut cm) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the body is not JSON");
        };
        let labels = cm["metadata"]["labels"].clone();
        let s = self.store();
        for ((k, _), o) in &s.objects {
            if *k != Kind::Vwc {
                continue;
            }
            for w in o["webhooks"].as_array().into_iter().flatten() {
                let sel = &w["objectSelector"];
                if sel["matchLabels"].get(PROBE_LABEL).is_some() && selects(sel, &labels) {
                    // The HCP is the one the configuration is claimed for (`<uid>/<namespace>`).
                    let ns = o["metadata"]["annotations"][CLAIM_ANNOTATION]
                        .as_str()
                        .and_then(|c| c.split_once('/'))
                        .map(|(_, ns)| ns.to_string())
                        .unwrap_or_default();
                    let key = self
                        .probe_keys
                        .lock()
                        .ok()
                        .and_then(|m| m.get(&ns).cloned());
                    let nonce = cm["metadata"]["annotations"][NONCE_ANNOTATION].as_str();
                    return status(
                        400,
                        "BadRequest",
                        &format!(
                            "admission webhook \"{}\" denied the request: {}",
                            w["name"].as_str().unwrap_or_default(),
                            answer(key.as_ref(), nonce)
                        ),
                    );
                }
            }
        }
        for ((k, bname), b) in &s.objects {
            if *k != Kind::Vapb || !selects(&b["spec"]["matchResources"]["objectSelector"], &labels)
            {
                continue;
            }
            let pname = b["spec"]["policyName"].as_str().unwrap_or_default();
            let Some(p) = s.objects.get(&(Kind::Vap, pname.to_string())) else {
                continue;
            };
            if !selects(&p["spec"]["matchConstraints"]["objectSelector"], &labels) {
                continue;
            }
            let message = p["spec"]["validations"][0]["message"]
                .as_str()
                .unwrap_or(hcp_fleet_guards::catalogue::POLICY_PROBE_ANSWER);
            // As a real server words it (admission.NewForbidden around the policy's denial);
            // docs/testbed.md, "Server texts".
            let name = cm["metadata"]["name"].as_str().unwrap_or_default();
            return forbidden(
                "configmaps",
                name,
                &format!(
                    "ValidatingAdmissionPolicy '{pname}' with binding '{bname}' denied request: {message}"
                ),
            );
        }
        // The mutating probe policy (`hosted::admission_policies`) writes the revision its
        // selector names into its answer annotation, as a real server applying it does; the
        // simulation runs no other mutating policy (no request of the bench is one they
        // change).
        let probe = hcp_fleet_guards::probe::ROW.name;
        let bound = s.objects.contains_key(&(Kind::Mapb, probe.to_string()));
        if let Some(p) = s
            .objects
            .get(&(Kind::Map, probe.to_string()))
            .filter(|_| bound)
        {
            let sel = &p["spec"]["matchConstraints"]["objectSelector"];
            if selects(sel, &labels) {
                let rev =
                    sel["matchLabels"][hcp_fleet_guards::catalogue::PROBE_REVISION_LABEL].clone();
                cm["metadata"]["annotations"][hcp_fleet_guards::catalogue::MUTATING_PROBE_ANSWER] =
                    rev;
            }
        }
        drop(s);
        cm["apiVersion"] = json!("v1");
        cm["kind"] = json!("ConfigMap");
        cm["metadata"]["namespace"] = json!(ns);
        if cm["metadata"]["name"].is_null() {
            let prefix = cm["metadata"]["generateName"]
                .as_str()
                .unwrap_or("cm-")
                .to_string();
            cm["metadata"]["name"] = json!(format!("{prefix}sim"));
        }
        json_response(StatusCode::CREATED, &cm)
    }
}

fn not_found(kind: Kind, name: &str) -> Response<Body> {
    status(
        404,
        "NotFound",
        &format!(
            "{}.admissionregistration.k8s.io \"{name}\" not found",
            kind.plural()
        ),
    )
}

/// A certificate and key (PEM) as rustls serves them.
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| e.to_string())?;
    let signing = hcp_fleet_guards::crypto::provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

/// Serving certificates chosen by SNI name.
#[derive(Debug, Default)]
pub struct BySni(pub Mutex<HashMap<String, Arc<CertifiedKey>>>);

impl rustls::server::ResolvesServerCert for BySni {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        self.0.lock().ok()?.get(name).cloned()
    }
}

/// Serves the cluster `route` names for each TLS connection's SNI name, over HTTP/2 or 1.1;
/// a connection it names none for ends after the handshake.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    certs: Arc<BySni>,
    route: impl Fn(&str) -> Option<Arc<SimCluster>> + Send + Sync + 'static,
) {
    let mut cfg = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(certs);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let route = Arc::new(route);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let route = route.clone();
        tokio::spawn(async move {
            let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let Some(handler) = tls.get_ref().1.server_name().and_then(|n| route(n)) else {
                return; // a handshake only (the agent asking which certificate is served)
            };
            let svc = hyper::service::service_fn(move |req| {
                let c = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(c.handle(req).await) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(1000);
            let _ = builder.serve_connection(TokioIo::new(tls), svc).await;
        });
    }
}

/// All simulated hosted clusters: one listener, one CA and SNI name each.
pub struct SimFleet {
    pub addr: SocketAddr,
    clusters: BTreeMap<String, Arc<SimCluster>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl SimFleet {
    /// Simulated clusters named `names`, each with its own CA, serving certificate for
    /// `<name>.simulated.test` and bearer token.
    pub async fn start(names: &[String], probe_keys: ProbeKeys) -> Result<SimFleet, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let certs = Arc::new(BySni::default());
        let mut clusters = BTreeMap::new();
        let mut by_sni = HashMap::new();
        let day = time::Duration::days(1);
        for (i, name) in names.iter().enumerate() {
            let sni = format!("{name}.simulated.test");
            let ca =
                generate_ca(&format!("{name} simulated CA"), day).map_err(|e| e.to_string())?;
            let serving = issue(
                &ca,
                &sni,
                &Usage::Server {
                    sans: vec![sni.clone()],
                },
                day,
            )
            .map_err(|e| e.to_string())?;
            let key = certified_key(&serving.cert_pem, &serving.key_pem)?;
            if let Ok(mut m) = certs.0.lock() {
                m.insert(sni.clone(), key);
            }
            let token = format!("sim-token-{i}-{}", short_hash(name));
            let b64 = base64::engine::general_purpose::STANDARD;
            let kubeconfig = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\n    tls-server-name: {sni}\nusers:\n- name: agent\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: agent\ncurrent-context: {name}\n",
                ca = b64.encode(&ca.cert_pem),
            );
            let c = Arc::new(SimCluster {
                name: name.clone(),
                kubeconfig,
                token,
                uid: format!("00000000-0000-4000-8000-{i:012}"),
                store: Mutex::default(),
                requests: Requests {
                    calls: (i == 0).then(Mutex::default),
                    ..Requests::default()
                },
                probe_keys: probe_keys.clone(),
            });
            by_sni.insert(sni, c.clone());
            clusters.insert(name.clone(), c);
        }
        let by_sni = Arc::new(by_sni);
        let server = tokio::spawn(serve_tls(listener, certs, move |sni: &str| {
            by_sni.get(sni).cloned()
        }));
        Ok(SimFleet {
            addr,
            clusters,
            server,
        })
    }

    pub fn cluster(&self, name: &str) -> Option<&Arc<SimCluster>> {
        self.clusters.get(name)
    }

    pub fn clusters(&self) -> impl Iterator<Item = &Arc<SimCluster>> {
        self.clusters.values()
    }
}

/// The first 8 bytes of `s`'s SHA-256, in hex.
fn short_hash(s: &str) -> String {
    let digest = hcp_fleet_guards::crypto::sha256(s.as_bytes());
    hcp_fleet_guards::crypto::hex(&digest[..8])
}
