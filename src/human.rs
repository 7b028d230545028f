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
/// the error and its causes joined by `: ` (connection refused, a TLS failure, a timeout).
pub(crate) struct KubeError<'a>(pub &'a kube::Error);

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
            other => chain(f, other),
        }
    }
}

/// A watch's error for a person: what the watch was doing, then the API error as `KubeError`
/// reads it.
pub(crate) struct WatchError<'a>(pub &'a kube::runtime::watcher::Error);

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
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    f.write_str(&text)
}

/// The HTTP status of an API error, if it is one.
pub fn code(e: &kube::Error) -> Option<u16> {
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
        assert!(text.contains("connection refused"), "{text}");
        assert!(!shows_debug(&text), "{text}");
        assert_eq!(code(&e), None);
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
