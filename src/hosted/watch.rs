//! A list-then-watch of one kind in a hosted cluster: the events and errors of kube-runtime's
//! `watcher` (so the drift watch classifies them and backs off the same way), reading each
//! event's line into a buffer that is empty between events. kube's watcher keeps an 8 KiB
//! line buffer for the life of each watch, and a hosted cluster has up to four: about 32 KiB
//! per HCP at a thousand, for watches that are quiet for hours (`make bench`, heaptrack).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use http_body_util::BodyExt;
use kube::Resource;
use kube::api::{ListParams, ObjectList, WatchParams};
use kube::core::{Request, Status, WatchEvent};
use kube::runtime::watcher::{Error, Event};
use tower::ServiceExt;

use super::clients::{HostedBody, HostedService};
use serde::de::DeserializeOwned;

/// What a watch selects, as in `watcher::Config`.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub labels: Option<String>,
    pub fields: Option<String>,
    /// Objects per page of a listing (`None`: the server's whole answer at once).
    pub page: Option<u32>,
}

/// A line buffer larger than this after an event is given back, not kept for the next one:
/// the agent's objects are a few KiB, a tenant's labelled one may be far larger.
const LINE_KEPT: usize = 4 * 1024;

/// How long one watch request lasts before the server ends it and it is resumed. kube's
/// watcher asks for 290 s because it finds a dead connection only when a watch ends; here
/// HTTP/2 pings find one within 15 s (`clients::KEEPALIVE_INTERVAL`), so a watch may last as
/// long as a kube-apiserver's own default (`--min-request-timeout`, 1,800 s): at a thousand
/// hosted clusters, four watches each, 290 s was 14 requests a second at rest.
const WATCH_SECONDS: u32 = 1800;

/// The events of `K` in the cluster `client` talks to, as `watcher(api, config)` yields them:
/// `Init`, one `InitApply` per listed object, `InitDone`, then `Apply` and `Delete` as the
/// watch sees changes; a relist (`Init` again) after the server says the watch's version is
/// gone. Errors are yielded and the stream goes on (wrap it in a backoff).
///
/// `service` is shared by every watch of the cluster (cloned per request, not per watch): a
/// hosted cluster has a watch per object the agent wants there, quiet for hours.
pub fn watch<K>(
    service: Arc<HostedService>,
    selection: Selection,
) -> impl futures::Stream<Item = Result<Event<K>, Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + 'static,
{
    let lean = Lean {
        service,
        request: Request::new(K::url_path(&(), None)),
        selection,
        state: State::Empty,
    };
    futures::stream::unfold(lean, |mut lean| async move {
        let item = lean.step().await;
        Some((item, lean))
    })
}

struct Lean<K> {
    service: Arc<HostedService>,
    request: Request,
    selection: Selection,
    state: State<K>,
}

enum State<K> {
    /// A (re)list is due.
    Empty,
    /// Listing: the objects of the page read and not yet yielded, the next page's token
    /// (`None` once the last page is read), and the listing's version.
    Listing {
        items: VecDeque<K>,
        next: Option<Option<String>>,
        version: Option<String>,
    },
    /// Listed, or between two watch requests: watch from `version`.
    Listed { version: String },
    Watching {
        version: String,
        body: HostedBody,
        /// The part of the last frame not yet read, and the line it continues.
        chunk: Bytes,
        line: Vec<u8>,
    },
}

impl<K> Lean<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + 'static,
{
    async fn step(&mut self) -> Result<Event<K>, Error> {
        loop {
            let out = match &mut self.state {
                State::Empty => {
                    self.state = State::Listing {
                        items: VecDeque::new(),
                        next: Some(None),
                        version: None,
                    };
                    Some(Ok(Event::Init))
                }
                State::Listing { .. } => self.list().await,
                State::Listed { .. } => self.start().await,
                State::Watching { .. } => self.read().await,
            };
            if let Some(out) = out {
                return out;
            }
        }
    }

    /// The next listed object, the next page, or the end of the listing.
    async fn list(&mut self) -> Option<Result<Event<K>, Error>> {
        let State::Listing {
            items,
            next,
            version,
        } = &mut self.state
        else {
            return None;
        };
        if let Some(o) = items.pop_front() {
            return Some(Ok(Event::InitApply(o)));
        }
        let Some(token) = next.take() else {
            let Some(version) = version.take() else {
                self.state = State::Empty;
                return Some(Err(Error::NoResourceVersion));
            };
            self.state = State::Listed { version };
            return Some(Ok(Event::InitDone));
        };
        // Boxed, as the watch request below: a request's future is large, and inline it would
        // size every hosted cluster's four watches by it for as long as they wait for events.
        match Box::pin(list_page(
            &self.service,
            &self.request,
            &self.selection,
            token,
        ))
        .await
        {
            Ok(page) => {
                *version = page.metadata.resource_version.clone();
                *next = page.metadata.continue_.filter(|c| !c.is_empty()).map(Some);
                items.extend(page.items);
                None
            }
            Err(e) => {
                self.state = State::Empty;
                Some(Err(Error::InitialListFailed(e)))
            }
        }
    }

    /// A watch request from the version listed or last seen.
    async fn start(&mut self) -> Option<Result<Event<K>, Error>> {
        let State::Listed { version } = &mut self.state else {
            return None;
        };
        let version = std::mem::take(version);
        match Box::pin(start_watch(
            &self.service,
            &self.request,
            &self.selection,
            &version,
        ))
        .await
        {
            Ok(body) => {
                self.state = State::Watching {
                    version,
                    body,
                    chunk: Bytes::new(),
                    line: Vec::new(),
                };
                None
            }
            Err(e) => {
                self.state = State::Listed { version };
                Some(Err(Error::WatchStartFailed(e)))
            }
        }
    }

    /// The next line of the watch read (`None` when it said nothing to pass on), or the next
    /// frame awaited.
    async fn read(&mut self) -> Option<Result<Event<K>, Error>> {
        let State::Watching {
            version,
            body,
            chunk,
            line,
        } = &mut self.state
        else {
            return None;
        };
        if let Some(end) = chunk.iter().position(|b| *b == b'\n') {
            let head = chunk.split_to(end + 1);
            let event = if line.is_empty() {
                parse::<K>(&head[..end])
            } else {
                line.extend_from_slice(&head[..end]);
                let event = parse::<K>(line);
                line.clear();
                if line.capacity() > LINE_KEPT {
                    *line = Vec::new();
                }
                event
            };
            return match event {
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
                    None
                }
                Parsed::Blank => None,
                Parsed::Gone(status) => {
                    // The version is too old to watch from: list again.
                    self.state = State::Empty;
                    Some(Err(Error::WatchError(status)))
                }
                Parsed::Status(status) => Some(Err(Error::WatchError(status))),
                Parsed::Invalid(e) => Some(Err(Error::WatchFailed(kube::Error::SerdeError(e)))),
            };
        }
        if !chunk.is_empty() {
            line.extend_from_slice(chunk);
            chunk.advance(chunk.len());
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    *chunk = data;
                }
                None
            }
            // The server ended the watch (its timeout) or closed the connection without TLS's
            // goodbye, as servers do after a while: resume from the version seen.
            None => {
                resume(&mut self.state);
                None
            }
            Some(Err(e)) => {
                resume(&mut self.state);
                let e = kube::Error::Service(e);
                (!ends_quietly(&e)).then_some(Err(Error::WatchFailed(e)))
            }
        }
    }
}

/// From watching to listed (to watch again from the version seen).
fn resume<K>(state: &mut State<K>) {
    if let State::Watching { version, .. } = state {
        let version = std::mem::take(version);
        *state = State::Listed { version };
    }
}

async fn list_page<K: DeserializeOwned + Clone>(
    service: &HostedService,
    request: &Request,
    selection: &Selection,
    token: Option<String>,
) -> Result<ObjectList<K>, kube::Error> {
    let params = ListParams {
        label_selector: selection.labels.clone(),
        field_selector: selection.fields.clone(),
        limit: selection.page,
        continue_token: token,
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
    selection: &Selection,
    version: &str,
) -> Result<HostedBody, kube::Error> {
    let params = WatchParams {
        label_selector: selection.labels.clone(),
        field_selector: selection.fields.clone(),
        timeout: Some(WATCH_SECONDS),
        bookmarks: true,
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

fn note_version<K: Resource>(version: &mut String, o: &K) {
    if let Some(v) = &o.meta().resource_version {
        version.clone_from(v);
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
