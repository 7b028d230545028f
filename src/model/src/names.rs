//! Kubernetes and DNS names: a leaf module, so the configuration and the certificates can
//! both check names without importing each other, and the configuration can name the agent's
//! own labels without importing what renders them (`management`).

/// The label the agent finds (and prunes) its management objects by, and its value.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "hcp-fleet-agent";
/// The label naming the component (the admission service) on the agent's objects.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/name";

/// Why a name is not an RFC 1123 host name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsNameError {
    #[error("must be 1 to 253 characters")]
    Length,
    #[error("label {0:?} must be 1 to 63 characters")]
    LabelLength(String),
    #[error("label {0:?} may hold only lower-case letters, digits and '-'")]
    LabelCharacters(String),
    #[error("label {0:?} must not start or end with '-'")]
    LabelEdge(String),
}

/// RFC 1123 host names only: rcgen accepts any ASCII, and a certificate naming something no
/// client can ask for is a silent misconfiguration.
pub fn validate_dns_name(name: &str) -> Result<(), DnsNameError> {
    if name.is_empty() || name.len() > 253 {
        return Err(DnsNameError::Length);
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(DnsNameError::LabelLength(label.into()));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(DnsNameError::LabelCharacters(label.into()));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(DnsNameError::LabelEdge(label.into()));
        }
    }
    Ok(())
}

/// The Lease the replicas elect a leader on, in the agent's namespace; another installation
/// reads it to know whether this one lives (`controller/ownership.rs`).
pub const LEASE_NAME: &str = "hcp-fleet-agent";
