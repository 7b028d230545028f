//! The drift watch's reads of one hosted cluster: a list-then-watch of each object the agent
//! wants there, by name, all of them in one stream (`Watches`) that yields the events and
//! errors of kube-runtime's `watcher` for each (so the drift watch classifies them the same
//! way) and backs off each on its own.
//!
//! A hosted cluster has a watch per object the agent wants (about twenty where the guards run
//! as admission policies), quiet for hours, at a thousand hosted clusters. So an idle watch
//! holds no future, no stream adapter and no line buffer: its name, the version it watches
//! from and the response body it reads (`Slot`), polled in place. Twenty of kube's `watcher`
//! each (an 8 KiB line buffer for its life) were 160 KiB per cluster; twenty boxed stream
//! stacks of the earlier lean watch about 40 KiB (`make bench`, the scale benchmark).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use kube::api::{ListParams, ObjectList, WatchParams};
use kube::core::{Request, Status, WatchEvent};
use kube::runtime::watcher::{Error, Event};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tower::ServiceExt;

use super::clients::{HostedBody, HostedService};

/// A line buffer larger than this after an event is given back, not kept for the next one.
const LINE_KEPT: usize = 4 * 1024;

/// How long one watch request lasts before the server ends it and it is resumed. kube's
/// watcher asks for 290 s because it finds a dead connection only when a watch ends; here
/// HTTP/2 pings find one within 15 s (`clients::KEEPALIVE_INTERVAL`), so a watch may last as
/// long as a kube-apiserver's own default (`--min-request-timeout`, 1,800 s).
const WATCH_SECONDS: u32 = 1800;

/// `WATCH_SECONDS`, or (for the scale benchmark's figure of what resuming watches costs) the
/// seconds in `HCP_FLEET_TEST_WATCH_SECONDS` where the test hooks are on.
fn watch_seconds() -> u32 {
    static SECONDS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SECONDS.get_or_init(|| {
        let hooks = std::env::var_os("HCP_FLEET_TEST_HOOKS").is_some_and(|v| !v.is_empty());
        std::env::var("HCP_FLEET_TEST_WATCH_SECONDS")
            .ok()
            .filter(|_| hooks)
            .and_then(|v| v.parse().ok())
            .unwrap_or(WATCH_SECONDS)
    })
}

/// Requests that open a watch (a listing, or a watch waiting for its answer) at once, per
/// hosted cluster. Twenty opening together queued twenty requests at once, and hyper's
/// dispatch channel and h2's stream and frame stores keep the room they grew to for the
/// connection's life: a few KiB per hosted cluster, at a thousand of them.
const OPENING: usize = 2;

/// Backoff after a failure, per watch: from the first delay, doubling, to the last (kube's
/// default backoff: 0.8 s to 30 s).
const FIRST_DELAY: Duration = Duration::from_millis(800);
const LAST_DELAY: Duration = Duration::from_secs(30);

/// One object to watch: its kind (`ValidatingAdmissionPolicy`, …), its collection's API
/// path and its name (shared: every HCP's guards have the same names).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Watched {
    pub(crate) kind: &'static str,
    pub(crate) path: &'static str,
    pub(crate) name: Arc<str>,
}

/// The watches of one hosted cluster, as one stream of (which watch, what it saw). Never ends.
pub(crate) struct Watches {
    service: HostedService,
    slots: Vec<Slot>,
    /// Where the next poll starts, so one busy watch cannot starve the others.
    next: usize,
}

/// One watch, as little as it can be while idle: what it watches is shared or static, the
/// request and its selector are made when a request is sent.
struct Slot {
    kind: &'static str,
    path: &'static str,
    name: Arc<str>,
    state: State,
    /// Failures in a row (the backoff's exponent); reset by a watch that opens.
    failures: u32,
}

enum State {
    /// A (re)list is due: yields `Init`.
    Empty,
    /// The listing's request, in flight.
    Listing(BoxFuture<'static, Result<ObjectList<Value>, kube::Error>>),
    /// Listed: its objects to yield, then `InitDone`; watch from `version`.
    Listed {
        items: std::vec::IntoIter<Value>,
        version: String,
    },
    /// Between two watch requests: watch from `version`.
    Resume { version: String },
    /// The watch's request, in flight.
    Opening {
        version: String,
        request: BoxFuture<'static, Result<HostedBody, kube::Error>>,
    },
    Watching {
        version: String,
        body: HostedBody,
        /// The part of the last frame not yet read, and the line it continues.
        chunk: Bytes,
        line: Vec<u8>,
    },
    /// Waiting after a failure, then `then`.
    Backoff {
        sleep: Pin<Box<tokio::time::Sleep>>,
        then: Box<State>,
    },
}

impl Watches {
    /// The watches of `watched` for a caller that reads every one of these objects itself
    /// right after (a new drift watch is always followed by the install's reads, and a listing
    /// before the install is passed over): each kind listed once, by one of its names, for a
    /// version to watch from, and no watch lists its own object. A listing per object was 32
    /// of the 113 requests a restarted agent made to each hosted cluster at 3,000 HCPs (85 now;
    /// `make bench`, the scale benchmark). A kind not listed within `within` (all of them
    /// together: the install waits as long) lists its objects one by one, each watch with its
    /// own errors and backoff.
    pub(crate) async fn started(
        service: HostedService,
        watched: Vec<Watched>,
        within: Duration,
    ) -> Self {
        let mut first: Vec<(&'static str, Arc<str>)> = Vec::new();
        for w in &watched {
            if !first.iter().any(|(path, _)| *path == w.path) {
                first.push((w.path, Arc::clone(&w.name)));
            }
        }
        let mut versions = HashMap::new();
        let listing = async {
            for kinds in first.chunks(OPENING) {
                let listed = futures::future::join_all(
                    kinds
                        .iter()
                        .map(|(path, name)| kind_version(service.clone(), path, name)),
                )
                .await;
                versions.extend(listed.into_iter().flatten());
            }
        };
        let _ = tokio::time::timeout(within, listing).await;
        Self::from_versions(service, watched, &versions)
    }

    /// Each watch from its kind's version in `versions`, else from a listing of its own.
    fn from_versions(
        service: HostedService,
        watched: Vec<Watched>,
        versions: &HashMap<&'static str, String>,
    ) -> Self {
        let slots = watched
            .into_iter()
            .map(|w| Slot {
                kind: w.kind,
                path: w.path,
                name: w.name,
                state: match versions.get(w.path) {
                    Some(version) => State::Resume {
                        version: version.clone(),
                    },
                    None => State::Empty,
                },
                failures: 0,
            })
            .collect();
        Self {
            service,
            slots,
            next: 0,
        }
    }
}

impl futures::Stream for Watches {
    /// The watch's kind and the name it watches, and what it saw.
    type Item = (&'static str, Arc<str>, Result<Event<Value>, Error>);

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let n = this.slots.len();
        let mut opening = Opening {
            in_flight: this
                .slots
                .iter()
                .filter(|s| matches!(s.state, State::Listing(_) | State::Opening { .. }))
                .count(),
            waiting: false,
        };
        for k in 0..n {
            let i = (this.next + k) % n;
            let slot = &mut this.slots[i];
            if let Poll::Ready(out) = slot.poll(&this.service, &mut opening, cx) {
                this.next = (i + 1) % n.max(1);
                return Poll::Ready(Some((slot.kind, Arc::clone(&slot.name), out)));
            }
        }
        // A watch waits for room to open while a request finished in this very pass (after
        // it was looked at): nothing else would wake the task for it.
        if opening.waiting && opening.in_flight < OPENING {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// The cluster's watches with a request in flight, and whether one waits for room.
struct Opening {
    in_flight: usize,
    waiting: bool,
}

impl Opening {
    /// Room for one more request (`false`: noted as waiting).
    fn take(&mut self) -> bool {
        if self.in_flight >= OPENING {
            self.waiting = true;
            return false;
        }
        self.in_flight += 1;
        true
    }

    fn done(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }
}

impl Slot {
    /// Drives this watch until it has something to say, or waits (its waker registered).
    /// `opening`: the cluster's watches with a request in flight (at most `OPENING`).
    fn poll(
        &mut self,
        service: &HostedService,
        opening: &mut Opening,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Event<Value>, Error>> {
        loop {
            match &mut self.state {
                State::Empty => {
                    if !opening.take() {
                        // Woken when a request in flight completes (the same task).
                        return Poll::Pending;
                    }
                    let (service, request, fields) =
                        (service.clone(), self.request(), self.fields());
                    self.state = State::Listing(Box::pin(async move {
                        list_page(&service, &request, &fields).await
                    }));
                    return Poll::Ready(Ok(Event::Init));
                }
                State::Listing(fut) => match fut.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(list)) => {
                        opening.done();
                        let Some(version) = list.metadata.resource_version else {
                            return Poll::Ready(Err(
                                self.fail(State::Empty, Error::NoResourceVersion)
                            ));
                        };
                        self.state = State::Listed {
                            items: list.items.into_iter(),
                            version,
                        };
                    }
                    Poll::Ready(Err(e)) => {
                        opening.done();
                        return Poll::Ready(Err(
                            self.fail(State::Empty, Error::InitialListFailed(e))
                        ));
                    }
                },
                State::Listed { items, version } => {
                    if let Some(o) = items.next() {
                        return Poll::Ready(Ok(Event::InitApply(o)));
                    }
                    let version = std::mem::take(version);
                    self.state = State::Resume { version };
                    return Poll::Ready(Ok(Event::InitDone));
                }
                State::Resume { version } => {
                    if !opening.take() {
                        return Poll::Pending;
                    }
                    let version = std::mem::take(version);
                    let (service, request, fields, from) = (
                        service.clone(),
                        self.request(),
                        self.fields(),
                        version.clone(),
                    );
                    self.state = State::Opening {
                        version,
                        request: Box::pin(async move {
                            start_watch(&service, &request, &fields, &from).await
                        }),
                    };
                }
                State::Opening { version, request } => match request.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(body)) => {
                        opening.done();
                        self.failures = 0;
                        self.state = State::Watching {
                            version: std::mem::take(version),
                            body,
                            chunk: Bytes::new(),
                            line: Vec::new(),
                        };
                    }
                    Poll::Ready(Err(e)) => {
                        opening.done();
                        let version = std::mem::take(version);
                        return Poll::Ready(Err(
                            self.fail(State::Resume { version }, Error::WatchStartFailed(e))
                        ));
                    }
                },
                State::Watching { .. } => match self.read(cx) {
                    Poll::Ready(Some(out)) => return Poll::Ready(out),
                    Poll::Ready(None) => {}
                    Poll::Pending => return Poll::Pending,
                },
                State::Backoff { sleep, then } => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let then = std::mem::replace(then.as_mut(), State::Empty);
                    self.state = then;
                }
            }
        }
    }

    fn request(&self) -> Request {
        Request::new(self.path)
    }

    fn fields(&self) -> String {
        format!("metadata.name={}", self.name)
    }

    /// Backs off before `then`, and returns `e` to yield.
    fn fail(&mut self, then: State, e: Error) -> Error {
        let delay = FIRST_DELAY
            .saturating_mul(1 << self.failures.min(6))
            .min(LAST_DELAY);
        self.failures = self.failures.saturating_add(1);
        self.state = State::Backoff {
            sleep: Box::pin(tokio::time::sleep(delay)),
            then: Box::new(then),
        };
        e
    }

    /// The next line of the watch read (`Ready(None)`: the state moved on, poll again), or
    /// the next frame awaited.
    fn read(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Event<Value>, Error>>> {
        let State::Watching {
            version,
            body,
            chunk,
            line,
        } = &mut self.state
        else {
            return Poll::Ready(None);
        };
        loop {
            if let Some(end) = chunk.iter().position(|b| *b == b'\n') {
                let head = chunk.split_to(end + 1);
                let event = if line.is_empty() {
                    parse::<Value>(&head[..end])
                } else {
                    line.extend_from_slice(&head[..end]);
                    let event = parse::<Value>(line);
                    line.clear();
                    if line.capacity() > LINE_KEPT {
                        *line = Vec::new();
                    }
                    event
                };
                return Poll::Ready(match event {
                    Parsed::Apply(o) => {
                        note_version(version, &o);
                        Some(Ok(Event::Apply(o)))
                    }
                    Parsed::Delete(o) => {
                        note_version(version, &o);
                        Some(Ok(Event::Delete(o)))
                    }
                    Parsed::Bookmark(v) => {
                        *version = v;
                        continue;
                    }
                    Parsed::Blank => continue,
                    Parsed::Gone(status) => {
                        // The version is too old to watch from: list again.
                        self.state = State::Empty;
                        Some(Err(Error::WatchError(status)))
                    }
                    Parsed::Status(status) => Some(Err(Error::WatchError(status))),
                    Parsed::Invalid(e) => Some(Err(Error::WatchFailed(kube::Error::SerdeError(e)))),
                });
            }
            if !chunk.is_empty() {
                line.extend_from_slice(chunk);
                chunk.advance(chunk.len());
            }
            match hyper::body::Body::poll_frame(Pin::new(&mut *body), cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        *chunk = data;
                    }
                }
                // The server ended the watch (its timeout) or closed the connection without
                // TLS's goodbye, as servers do after a while: resume from the version seen.
                Poll::Ready(None) => {
                    let version = std::mem::take(version);
                    self.state = State::Resume { version };
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    let version = std::mem::take(version);
                    let e = kube::Error::Service(e);
                    if ends_quietly(&e) {
                        self.state = State::Resume { version };
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(
                        self.fail(State::Resume { version }, Error::WatchFailed(e))
                    )));
                }
            }
        }
    }
}

/// The version of `path`'s collection now, from a listing of the one object `name` (a
/// listing by name: a tenant's objects of the kind are never read); `None` if it failed.
async fn kind_version(
    service: HostedService,
    path: &'static str,
    name: &str,
) -> Option<(&'static str, String)> {
    let fields = format!("metadata.name={name}");
    let listed = list_page::<Value>(&service, &Request::new(path), &fields).await;
    Some((path, listed.ok()?.metadata.resource_version?))
}

async fn list_page<K: DeserializeOwned + Clone>(
    service: &HostedService,
    request: &Request,
    fields: &str,
) -> Result<ObjectList<K>, kube::Error> {
    let params = ListParams {
        field_selector: Some(fields.to_string()),
        ..Default::default()
    };
    let req = request.list(&params).map_err(kube::Error::BuildRequest)?;
    let body = send(service, req).await?;
    let bytes = body
        .collect()
        .await
        .map_err(kube::Error::Service)?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(kube::Error::SerdeError)
}

async fn start_watch(
    service: &HostedService,
    request: &Request,
    fields: &str,
    version: &str,
) -> Result<HostedBody, kube::Error> {
    // No bookmarks: at rest a kube-apiserver sends each watch one a minute, and twenty
    // watches per hosted cluster made them most of the agent's idle CPU at a thousand
    // (docs/architecture.md). What they buy, a version recent enough to resume from, is
    // rarely missed for a watch on one name: its own version stays in the watch cache while
    // the kind is quiet, and where it has aged out the server answers 410 and the object is
    // read again by name (one GET), once per watch per `WATCH_SECONDS` at most.
    let params = WatchParams {
        field_selector: Some(fields.to_string()),
        timeout: Some(watch_seconds()),
        bookmarks: false,
        ..Default::default()
    };
    let req = request
        .watch(&params, version)
        .map_err(kube::Error::BuildRequest)?;
    send(service, req).await
}

/// One request on the connection: the response's body, or the server's refusal as kube
/// words it (its Status where it sent one).
async fn send(
    service: &HostedService,
    req: http::Request<Vec<u8>>,
) -> Result<HostedBody, kube::Error> {
    let res = service
        .clone()
        .oneshot(req.map(kube::client::Body::from))
        .await
        .map_err(kube::Error::Service)?;
    let status = res.status();
    if status.is_success() {
        return Ok(res.into_body());
    }
    let text = res
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let status = serde_json::from_str::<Status>(&text).unwrap_or_else(|_| {
        Status::failure(text.trim(), "Failed to parse error data").with_code(status.as_u16())
    });
    Err(kube::Error::Api(status.boxed()))
}

/// One line of a watch, read.
enum Parsed<K> {
    Apply(K),
    Delete(K),
    Bookmark(String),
    Blank,
    Gone(Box<Status>),
    Status(Box<Status>),
    Invalid(serde_json::Error),
}

fn parse<K: DeserializeOwned>(line: &[u8]) -> Parsed<K> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Parsed::Blank;
    }
    match serde_json::from_slice::<WatchEvent<K>>(line) {
        Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => Parsed::Apply(o),
        Ok(WatchEvent::Deleted(o)) => Parsed::Delete(o),
        Ok(WatchEvent::Bookmark(b)) => Parsed::Bookmark(b.metadata.resource_version),
        Ok(WatchEvent::Error(s)) if s.code == 410 => Parsed::Gone(s),
        Ok(WatchEvent::Error(s)) => Parsed::Status(s),
        // A bare Status where an event was due: the server's error, as kube reads it.
        Err(e) => match serde_json::from_slice::<Status>(line) {
            Ok(s) if s.code == 410 => Parsed::Gone(Box::new(s)),
            Ok(s) => Parsed::Status(Box::new(s)),
            Err(_) => Parsed::Invalid(e),
        },
    }
}

fn note_version(version: &mut String, o: &Value) {
    if let Some(v) = o["metadata"]["resourceVersion"].as_str() {
        v.clone_into(version);
    }
}

/// A connection closed without TLS's close_notify, found anywhere in the error's chain: the
/// end of a watch, not a failure (as kube's watcher takes it).
fn ends_quietly(e: &kube::Error) -> bool {
    eof_in(e)
}

fn eof_in(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        // An io::Error's `source` skips the error it wraps; `get_ref` is that error.
        if io.kind() == std::io::ErrorKind::UnexpectedEof
            || io.get_ref().is_some_and(|inner| eof_in(inner))
        {
            return true;
        }
    }
    e.source().is_some_and(eof_in)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration as Vwc;

    #[test]
    fn each_kind_of_line_is_read_as_kubes_watcher_reads_it() {
        let obj = r#"{"apiVersion":"admissionregistration.k8s.io/v1","kind":"ValidatingWebhookConfiguration","metadata":{"name":"a","resourceVersion":"7"}}"#;
        let line = |t: &str| format!(r#"{{"type":"{t}","object":{obj}}}"#);
        assert!(
            matches!(parse::<Vwc>(line("ADDED").as_bytes()), Parsed::Apply(o) if o.metadata.name.as_deref() == Some("a"))
        );
        assert!(matches!(
            parse::<Vwc>(line("MODIFIED").as_bytes()),
            Parsed::Apply(_)
        ));
        assert!(matches!(
            parse::<Vwc>(line("DELETED").as_bytes()),
            Parsed::Delete(_)
        ));
        let bookmark = r#"{"type":"BOOKMARK","object":{"kind":"ValidatingWebhookConfiguration","apiVersion":"admissionregistration.k8s.io/v1","metadata":{"resourceVersion":"12"}}}"#;
        assert!(matches!(parse::<Vwc>(bookmark.as_bytes()), Parsed::Bookmark(v) if v == "12"));
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}"#;
        assert!(matches!(parse::<Vwc>(gone.as_bytes()), Parsed::Gone(s) if s.code == 410));
        let forbidden = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"no","reason":"Forbidden","code":403}}"#;
        assert!(matches!(parse::<Vwc>(forbidden.as_bytes()), Parsed::Status(s) if s.code == 403));
        assert!(matches!(parse::<Vwc>(b"  "), Parsed::Blank));
        assert!(matches!(
            parse::<Vwc>(b"{\"type\":\"ADDED\",\"object\":"),
            Parsed::Invalid(_)
        ));
    }

    #[test]
    fn an_eof_anywhere_in_the_chain_ends_the_watch_quietly() {
        let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer closed");
        let wrapped = std::io::Error::other(eof);
        assert!(ends_quietly(&kube::Error::Service(Box::new(wrapped))));
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!ends_quietly(&kube::Error::Service(Box::new(reset))));
    }
}
