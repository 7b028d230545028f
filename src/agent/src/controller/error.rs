//! What can stop a reconcile: one variant per failure, each keeping its source error and
//! knowing the phase it belongs to, and through the phase the concern it is reported under.

use crate::hosted::clients::HostedAccessError;
use crate::human::{KubeError, credentials_hint};
use hcp_fleet_render::certificates::CertError;
use hcp_fleet_render::hosted::objects::WebhookRenderError;
use hcp_fleet_render::management::RenderError;
use hcp_fleet_render::reporting::Concern;

/// The phases of one reconcile (docs/architecture.md, "One reconcile, phase by phase"), each gated on
/// the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Certificates,
    AdmissionService,
    HostedAccess,
    HostedWebhooks,
    Probe,
}

impl Phase {
    pub(crate) const ALL: [Phase; 5] = [
        Phase::Certificates,
        Phase::AdmissionService,
        Phase::HostedAccess,
        Phase::HostedWebhooks,
        Phase::Probe,
    ];

    /// The `phase` label of `hcp_fleet_reconcile_errors_total`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Certificates => "certificates",
            Phase::AdmissionService => "admission-service",
            Phase::HostedAccess => "hosted-access",
            Phase::HostedWebhooks => "hosted-webhooks",
            Phase::Probe => "probe",
        }
    }

    /// The Policy template a failure in this phase is reported under.
    pub(crate) fn concern(self) -> Concern {
        match self {
            Phase::Certificates => Concern::Certificate,
            Phase::AdmissionService => Concern::AdmissionService,
            // Without access there are no webhooks: the operator looks there first.
            Phase::HostedAccess | Phase::HostedWebhooks => Concern::HostedWebhooks,
            Phase::Probe => Concern::EndToEndProbe,
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed reconcile of the HCP in `namespace`.
#[derive(Debug, thiserror::Error)]
#[error("{namespace}: {}: {failure}", failure.phase())]
pub struct ReconcileError {
    pub(crate) namespace: String,
    #[source]
    pub(crate) failure: Failure,
}

/// What failed. The message is what the health record's history shows (without the namespace:
/// the record lives in it), so each carries its source's text as well as the source itself.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("certificate: reading Secret {name}: {}", KubeError(.source))]
    ReadCertificates {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("certificate: {0}")]
    Certificate(#[source] CertError),
    #[error("rendering the admission service: {0}")]
    RenderAdmission(#[source] RenderError),
    #[error("applying the admission service: {kind} {name}: {}", KubeError(.source))]
    ApplyAdmission {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    HostedAccess(#[source] HostedAccessError),
    #[error("{0}")]
    RenderWebhooks(#[source] WebhookRenderError),
    #[error("hosted kube-apiserver {server}: {}", hosted_refusal(.source, .secret))]
    HostedApi {
        server: String,
        /// The kubeconfig Secret (`namespace/name`) the credentials came from.
        secret: String,
        #[source]
        source: kube::Error,
    },
    #[error("hosted kube-apiserver {server} did not answer within {seconds}s")]
    HostedTimeout { server: String, seconds: u64 },
    #[error(
        "hosted kube-apiserver {server} stopped answering: the agent's connection to it was dropped ({why}); it is asked again every 2s"
    )]
    HostedUnreachable { server: String, why: String },
    /// Replicas are listed, but not one completes a TLS handshake.
    #[error("admission service: no replica completes a TLS handshake: {why}")]
    AdmissionUnreachable { why: String },
    /// The Deployment was available and is not any more.
    #[error(
        "admission service: no ready replica ({ready} of {want}); the hosted kube-apiserver's calls fail and failurePolicy Ignore lets them through"
    )]
    AdmissionDown { ready: i32, want: i32 },
    /// HyperShift would delete the configurations as soon as they were installed.
    #[error(
        "not installed: HyperShift deletes guest webhooks whose URL ({url}) contains https://<Service> for a Service in the HCP namespace without the label hypershift.openshift.io/allow-guest-webhooks, and {services:?} match; label them or choose another admission.serviceName"
    )]
    GuestWebhooksCondemned { url: String, services: Vec<String> },
    /// A guard moves between engines; the old path stays until the new one answers.
    #[error(
        "moving guards to the {to}: hosted kube-apiserver {server} did not show the {to} in force within {seconds}s ({why}); both paths stay installed until it does"
    )]
    SwitchUnproven {
        server: String,
        to: &'static str,
        seconds: u64,
        why: String,
    },
    #[error("listing the Services of the HCP namespace: {}", KubeError(.0))]
    ListServices(#[source] kube::Error),
    /// Whether HyperShift's kube-apiserver mounts the static guards' files decides what they
    /// carry: not known, nothing is changed.
    #[error(
        "reading the kube-apiserver Deployment of the HCP namespace (whether it mounts the static guards): {}",
        KubeError(.0)
    )]
    ReadKubeApiserver(#[source] kube::Error),
    /// A new serving certificate is held back until the hosted cluster trusts its CA.
    #[error("certificate: the new certificate waits until the hosted cluster trusts its CA: {0}")]
    TrustFirst(#[source] Box<Failure>),
}

/// A hosted API server's refusal, with what to do about it where the credentials are the
/// likely cause.
pub(crate) fn hosted_refusal(source: &kube::Error, secret: &str) -> String {
    let text = KubeError(source).to_string();
    match crate::human::code(source).and_then(|c| credentials_hint(c, secret)) {
        Some(hint) => format!("{text}: {hint}"),
        None => text,
    }
}

impl Failure {
    pub(crate) fn phase(&self) -> Phase {
        match self {
            Failure::ReadCertificates { .. } | Failure::Certificate(_) | Failure::TrustFirst(_) => {
                Phase::Certificates
            }
            Failure::RenderAdmission(_)
            | Failure::ApplyAdmission { .. }
            | Failure::AdmissionUnreachable { .. }
            | Failure::AdmissionDown { .. } => Phase::AdmissionService,
            Failure::HostedAccess(_) => Phase::HostedAccess,
            Failure::RenderWebhooks(_)
            | Failure::GuestWebhooksCondemned { .. }
            | Failure::ListServices(_)
            | Failure::ReadKubeApiserver(_)
            | Failure::HostedApi { .. }
            | Failure::HostedTimeout { .. }
            | Failure::SwitchUnproven { .. }
            | Failure::HostedUnreachable { .. } => Phase::HostedWebhooks,
        }
    }

    pub(crate) fn in_namespace(self, namespace: &str) -> ReconcileError {
        ReconcileError {
            namespace: namespace.to_string(),
            failure: self,
        }
    }
}

impl ReconcileError {
    pub(crate) fn phase(&self) -> Phase {
        self.failure.phase()
    }

    pub(crate) fn concern(&self) -> Concern {
        self.phase().concern()
    }

    /// The violation as the Policy reports it.
    pub(crate) fn violation(&self) -> String {
        self.failure.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_namespace_and_phase_and_keep_the_source() {
        let e = Failure::HostedTimeout {
            server: "https://kube-apiserver.clusters-a.svc:6443".into(),
            seconds: 10,
        }
        .in_namespace("clusters-a");
        assert_eq!(
            e.to_string(),
            "clusters-a: hosted-webhooks: hosted kube-apiserver https://kube-apiserver.clusters-a.svc:6443 did not answer within 10s"
        );
        assert_eq!(e.concern(), Concern::HostedWebhooks);
        assert!(!e.violation().contains("clusters-a:"));
        let e = Failure::HostedAccess(HostedAccessError::SecretMissing {
            namespace: "clusters-a".into(),
            secret: "kc".into(),
        })
        .in_namespace("clusters-a");
        assert_eq!(e.phase(), Phase::HostedAccess);
        assert!(std::error::Error::source(&e).is_some());
    }

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code,
            message: reason.into(),
            reason: reason.into(),
            metadata: None,
            details: None,
        }))
    }

    fn refused() -> kube::Error {
        kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )))
    }

    /// Every failure that carries an API error, as each kind of API error, reads without
    /// Rust's Debug form: what reaches AdmissionHealth, its Events, the hub and `status`.
    #[test]
    fn no_failure_shows_debug_text_to_a_person() {
        let sources = || {
            [
                api(401, "Unauthorized"),
                api(403, "Forbidden"),
                api(404, "NotFound"),
                api(500, "InternalError"),
                refused(),
            ]
        };
        let mut messages = Vec::new();
        for source in sources() {
            messages.push(
                Failure::ReadCertificates {
                    name: "ca".into(),
                    source,
                }
                .to_string(),
            );
        }
        for source in sources() {
            messages.push(
                Failure::ApplyAdmission {
                    kind: "Deployment",
                    name: "d".into(),
                    source,
                }
                .to_string(),
            );
        }
        for source in sources() {
            messages.push(
                Failure::HostedApi {
                    server: "https://h:6443".into(),
                    secret: "clusters-a/admin-kubeconfig".into(),
                    source,
                }
                .to_string(),
            );
        }
        for source in sources() {
            messages.push(Failure::ListServices(source).to_string());
        }
        for source in sources() {
            messages.push(Failure::ReadKubeApiserver(source).to_string());
        }
        for source in sources() {
            messages.push(
                Failure::HostedAccess(HostedAccessError::ReadSecret {
                    namespace: "clusters-a".into(),
                    secret: "kc".into(),
                    source,
                })
                .to_string(),
            );
        }
        for source in sources() {
            messages.push(
                Failure::HostedAccess(HostedAccessError::ManagementIdentity {
                    namespace: "clusters-a".into(),
                    source,
                })
                .to_string(),
            );
        }
        for source in sources() {
            messages.push(
                Failure::HostedAccess(HostedAccessError::HostedIdentity {
                    namespace: "clusters-a".into(),
                    server: "https://h:6443".into(),
                    reason: hosted_refusal(&source, "clusters-a/kc"),
                })
                .to_string(),
            );
        }
        for m in &messages {
            assert!(!crate::human::shows_debug(m), "{m}");
        }
        let revoked = Failure::HostedApi {
            server: "https://h:6443".into(),
            secret: "clusters-a/admin-kubeconfig".into(),
            source: api(401, "Unauthorized"),
        }
        .to_string();
        assert!(revoked.contains("401 Unauthorized"), "{revoked}");
        assert!(
            revoked.contains("Secret clusters-a/admin-kubeconfig"),
            "{revoked}"
        );
    }

    #[test]
    fn every_phase_reports_under_a_concern() {
        for (p, c) in [
            (Phase::Certificates, Concern::Certificate),
            (Phase::AdmissionService, Concern::AdmissionService),
            (Phase::HostedAccess, Concern::HostedWebhooks),
            (Phase::HostedWebhooks, Concern::HostedWebhooks),
            (Phase::Probe, Concern::EndToEndProbe),
        ] {
            assert_eq!(p.concern(), c, "{p}");
        }
    }
}
