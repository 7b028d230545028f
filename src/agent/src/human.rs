//! Errors as the person who reads them needs them: in `AdmissionHealth`, its Events, on the ACM
//! hub, in `status` and in the logs. kube's own `Display` of an API error appends Rust's Debug
//! form of the whole `Status` (`ApiError: Unauthorized: Unauthorized (Status { status:
//! Some(Failure), code: 401, … })`); here an API error reads as the HTTP code, its reason and
//! the server's message, and any other error as its chain of causes.
//!
//! What an API server says may come from a hosted cluster's admins (a webhook's denial):
//! callers still pass the result through `reporting::untrusted` before storing it.

use std::fmt;

/// A kube error for a person: `401 Unauthorized`, `403 Forbidden: <the server's message>`, or
/// a failure to reach the server in plain words (`transport`): what reaches a health record or
/// the ACM hub names no type of the libraries underneath (`ServiceError`, `hyper::Error`).
pub struct KubeError<'a>(pub &'a kube::Error);

impl fmt::Display for KubeError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            kube::Error::Api(s) => {
                write!(f, "{}", s.code)?;
                if !s.reason.is_empty() {
                    write!(f, " {}", s.reason)?;
                }
                let message = s.message.trim();
                if !message.is_empty() && message != s.reason {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            other => f.write_str(&transport(other)),
        }
    }
}

/// What went wrong between the agent and a server, in plain words: the first cause in the
/// error's chain that one of these classes knows (a refused, reset or closed connection, no
/// answer in time, a name that does not resolve, a certificate refused, an answer that was
/// not the JSON expected), else the chain's own texts with the library's type names taken out.
pub(crate) fn transport(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(words) = plain(c) {
            return words;
        }
        cause = c.source();
    }
    let mut text = String::new();
    chain_into(&mut text, e);
    strip_type_names(&text)
}

/// One cause in plain words, where its class is known.
fn plain(c: &(dyn std::error::Error + 'static)) -> Option<String> {
    use std::io::ErrorKind as K;
    if let Some(io) = c.downcast_ref::<std::io::Error>() {
        let words = match io.kind() {
            K::ConnectionRefused => "the connection was refused (nothing answers at that address)",
            K::ConnectionReset | K::ConnectionAborted => "the connection was reset",
            K::BrokenPipe | K::UnexpectedEof => "the connection was closed",
            K::TimedOut => "no answer in time",
            K::NotConnected => "the connection was lost",
            K::AddrNotAvailable | K::HostUnreachable | K::NetworkUnreachable => {
                "the server cannot be reached from here"
            }
            // A name lookup that failed is an `io::Error` of no particular kind.
            _ if io.to_string().contains("failed to lookup address") => {
                "the server's name does not resolve"
            }
            // An io::Error wrapping another error (rustls's, h2's): its inner error decides.
            _ => return io.get_ref().and_then(|inner| plain(inner)),
        };
        return Some(words.to_string());
    }
    if let Some(t) = c.downcast_ref::<rustls::Error>() {
        return Some(tls(t));
    }
    if c.downcast_ref::<tokio::time::error::Elapsed>().is_some() {
        return Some("no answer in time".into());
    }
    if let Some(h) = c.downcast_ref::<hyper::Error>() {
        let words = if h.is_timeout() {
            "no answer in time"
        } else if h.is_incomplete_message() || h.is_closed() || h.is_canceled() {
            "the connection was closed before the answer was complete"
        } else {
            return None;
        };
        return Some(words.into());
    }
    if let Some(k) = c.downcast_ref::<kube::Error>() {
        return match k {
            kube::Error::SerdeError(_) => {
                Some("the answer could not be read (not the JSON the API defines)".into())
            }
            _ => None,
        };
    }
    None
}

/// A TLS failure in plain words.
fn tls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(c) => {
            let why = match c {
                C::UnknownIssuer => "signed by an authority the agent does not trust",
                C::Expired | C::ExpiredContext { .. } => "expired",
                C::NotValidYet | C::NotValidYetContext { .. } => "not valid yet",
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "not valid for the server's name"
                }
                C::Revoked => "revoked",
                C::BadSignature => "badly signed",
                _ => "not acceptable",
            };
            format!("the server's certificate was refused: {why}")
        }
        rustls::Error::AlertReceived(_) => {
            "the server ended the TLS handshake (it refused the agent's certificate or offer)"
                .into()
        }
        _ => "the TLS handshake failed".into(),
    }
}

/// `kube::Error`'s and the HTTP stack's own prefixes (`ServiceError: `, `HyperError: `) out of
/// a text: type names mean nothing to whoever reads it.
fn strip_type_names(text: &str) -> String {
    const PREFIXES: &[&str] = &[
        "ServiceError: ",
        "HyperError: ",
        "HttpError: ",
        "SerdeError: ",
        "BuildRequest: ",
        "UpgradeConnection: ",
        "Auth: ",
        "Discovery: ",
        "InferConfig: ",
    ];
    let mut out = text.to_string();
    for p in PREFIXES {
        out = out.replace(p, "");
    }
    out
}

/// A watch's error for a person: what the watch was doing, then the API error as `KubeError`
/// reads it.
pub struct WatchError<'a>(pub &'a kube::runtime::watcher::Error);

impl fmt::Display for WatchError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use kube::runtime::watcher::Error as W;
        match self.0 {
            W::InitialListFailed(k) => write!(f, "listing failed: {}", KubeError(k)),
            W::WatchStartFailed(k) => write!(f, "starting the watch failed: {}", KubeError(k)),
            W::WatchFailed(k) => write!(f, "the watch failed: {}", KubeError(k)),
            W::WatchError(s) => {
                write!(f, "the watch ended: {} {}: {}", s.code, s.reason, s.message)
            }
            other => chain(f, other),
        }
    }
}

/// `e` and each of its causes not already in the text before it, joined by `: `.
fn chain(f: &mut fmt::Formatter<'_>, e: &dyn std::error::Error) -> fmt::Result {
    let mut text = String::new();
    chain_into(&mut text, e);
    f.write_str(&strip_type_names(&text))
}

fn chain_into(text: &mut String, e: &dyn std::error::Error) {
    text.push_str(&e.to_string());
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
}

/// The HTTP status of an API error, if it is one.
pub(crate) fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// What a hosted kube-apiserver's refusal means and what to do next, for the codes whose
/// cause lies in the credentials the agent took from the HCP's kubeconfig `secret`
/// (`namespace/name`); `None` for others, whose server message says enough.
pub(crate) fn credentials_hint(code: u16, secret: &str) -> Option<String> {
    match code {
        401 => Some(format!(
            "the credentials in Secret {secret} were refused (revoked or expired); the agent \
             reads that Secret again whenever it changes, so check that HyperShift keeps it \
             current (`kubectl get secret` there), and nothing is installed on this cluster \
             until it is"
        )),
        403 => Some(format!(
            "the credentials in Secret {secret} are not allowed to do this; someone with \
             cluster-admin in the hosted cluster may have changed its RBAC, which HyperShift \
             restores: look at the hosted cluster's ClusterRoleBindings for that user"
        )),
        _ => None,
    }
}

/// Whether `text` shows Rust's Debug formatting of a value: what must never reach a person.
pub fn shows_debug(text: &str) -> bool {
    [
        "Status {",
        "Some(",
        "None,",
        "code: ",
        "ErrorResponse",
        "Error {",
        "kind: ",
        "\\\"",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code,
            message: message.into(),
            reason: reason.into(),
            metadata: None,
            details: None,
        }))
    }

    #[test]
    fn an_api_error_reads_as_its_code_reason_and_message() {
        let e = api(401, "Unauthorized", "Unauthorized");
        assert!(
            shows_debug(&e.to_string()),
            "kube's own form is what this replaces"
        );
        assert_eq!(KubeError(&e).to_string(), "401 Unauthorized");
        let e = api(
            403,
            "Forbidden",
            "namespaces \"kube-system\" is forbidden: User \"x\" cannot get resource",
        );
        assert_eq!(
            KubeError(&e).to_string(),
            "403 Forbidden: namespaces \"kube-system\" is forbidden: User \"x\" cannot get resource"
        );
        assert_eq!(code(&e), Some(403));
    }

    #[test]
    fn other_errors_read_as_their_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = kube::Error::Service(Box::new(io));
        let text = KubeError(&e).to_string();
        assert!(text.contains("the connection was refused"), "{text}");
        assert!(!shows_debug(&text), "{text}");
        assert_eq!(code(&e), None);
    }

    /// Type names of the libraries under the agent, which must never reach a person.
    fn names_a_type(text: &str) -> bool {
        [
            "Error:", "Error(", "Error {", "::", "Kind", "Elapsed", "Io(",
        ]
        .iter()
        .any(|n| text.contains(n))
            || shows_debug(text)
    }

    fn service(e: impl std::error::Error + Send + Sync + 'static) -> kube::Error {
        kube::Error::Service(Box::new(e))
    }

    /// Every class of transport failure reads in plain words, wrapped as the HTTP stack
    /// wraps it.
    #[tokio::test]
    async fn every_transport_failure_reads_in_plain_words() {
        use std::io::{Error, ErrorKind as K};
        let mut cases: Vec<(kube::Error, &str)> = vec![
            (
                service(Error::from(K::ConnectionRefused)),
                "the connection was refused",
            ),
            (
                service(Error::from(K::ConnectionReset)),
                "the connection was reset",
            ),
            (
                service(Error::from(K::ConnectionAborted)),
                "the connection was reset",
            ),
            (
                service(Error::from(K::BrokenPipe)),
                "the connection was closed",
            ),
            (
                service(Error::from(K::UnexpectedEof)),
                "the connection was closed",
            ),
            (service(Error::from(K::TimedOut)), "no answer in time"),
            (
                service(Error::from(K::NotConnected)),
                "the connection was lost",
            ),
            (
                service(Error::from(K::HostUnreachable)),
                "cannot be reached",
            ),
            (
                service(Error::other(
                    "failed to lookup address information: Name or service not known",
                )),
                "the server's name does not resolve",
            ),
            (
                service(Error::other(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer,
                ))),
                "certificate was refused: signed by an authority the agent does not trust",
            ),
            (
                service(Error::other(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::Expired,
                ))),
                "certificate was refused: expired",
            ),
            (
                service(Error::other(rustls::Error::AlertReceived(
                    rustls::AlertDescription::BadCertificate,
                ))),
                "the server ended the TLS handshake",
            ),
            (
                service(Error::other(rustls::Error::DecryptError)),
                "the TLS handshake failed",
            ),
            (
                kube::Error::SerdeError(
                    serde_json::from_str::<u32>("not json").expect_err("not json"),
                ),
                "the answer could not be read",
            ),
            // Anything else: its own words, without the type's name.
            (service(Error::other("something odd")), "something odd"),
        ];
        let elapsed = tokio::time::timeout(std::time::Duration::ZERO, std::future::pending::<()>())
            .await
            .expect_err("elapsed");
        cases.push((service(elapsed), "no answer in time"));
        cases.push((
            service(incomplete_answer().await),
            "the connection was closed",
        ));
        for (e, words) in &cases {
            let text = KubeError(e).to_string();
            assert!(text.contains(words), "{e:?} reads {text:?}, not {words:?}");
            assert!(!names_a_type(&text), "{e:?} reads {text:?}");
        }
    }

    /// A real hyper error: a server that promises 100 bytes, sends 3 and hangs up.
    async fn incomplete_answer() -> hyper::Error {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            if let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc")
                    .await;
            }
        });
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let req = http::Request::get("/")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let res = send.send_request(req).await.expect("response head");
        http_body_util::BodyExt::collect(res.into_body())
            .await
            .expect_err("the body ends early")
    }

    #[test]
    fn the_credentials_hint_names_the_secret() {
        let hint = credentials_hint(401, "clusters-a/admin-kubeconfig").unwrap_or_default();
        assert!(
            hint.contains("Secret clusters-a/admin-kubeconfig"),
            "{hint}"
        );
        assert!(credentials_hint(403, "s").is_some());
        assert!(credentials_hint(500, "s").is_none());
    }
}
