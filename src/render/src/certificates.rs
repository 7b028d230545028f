//! Certificates: CAs, serving and client certificates (rcgen), and the facts about a PEM
//! certificate that rotation decisions need (x509-parser).
//!
//! Everything here is pure: keys and certificates in, PEM out. Persisting them (in a Secret
//! for an HCP, on disk for the local control plane) is the caller's job.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("invalid subject alternative name {name:?}: {source}")]
    InvalidSan {
        name: String,
        #[source]
        source: SanError,
    },
    #[error("not a PEM certificate: {0}")]
    Pem(String),
    #[error("unparseable X.509 certificate: {0}")]
    X509(String),
    #[error("the system's random source failed")]
    Random,
}

/// A certificate with its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for KeyedCert {
    // Never print key material, even in debug logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedCert")
            .field("cert_pem", &format!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// What kind of certificate to issue from a CA.
#[derive(Debug, Clone)]
pub enum Usage {
    /// TLS server: SANs are DNS names or IP addresses.
    Server { sans: Vec<String> },
    /// TLS client: Kubernetes reads the user from CN and groups from O.
    Client { groups: Vec<String> },
}

fn validity(now: OffsetDateTime, lifetime: Duration) -> (OffsetDateTime, OffsetDateTime) {
    // Back-dated a little so a peer whose clock runs slightly behind accepts it at once.
    (now - Duration::minutes(5), now + lifetime)
}

/// The common name of an agent CA: the creation time makes each one distinct, so a TLS error
/// naming the CA ("… candidate authority certificate 'hcp-fleet-admission CA 2026-…'") says
/// which generation a client was offered, and a client looking a CA up by name finds one.
pub fn agent_ca_name(now: OffsetDateTime) -> String {
    let stamp = jiff::Timestamp::from_second(now.unix_timestamp())
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|_| now.unix_timestamp().to_string());
    format!("hcp-fleet-admission CA {stamp}")
}

/// A new self-signed CA.
pub fn generate_ca(common_name: &str, lifetime: Duration) -> Result<KeyedCert, CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let (nb, na) = validity(OffsetDateTime::now_utc(), lifetime);
    params.not_before = nb;
    params.not_after = na;
    let cert = params.self_signed(&key)?;
    Ok(KeyedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn san(name: &str) -> Result<SanType, CertError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let invalid = |source| CertError::InvalidSan {
        name: name.to_string(),
        source,
    };
    validate_dns_name(name).map_err(|e| invalid(SanError::Name(e)))?;
    let dns = name
        .try_into()
        .map_err(|e: rcgen::Error| invalid(SanError::Refused(e)))?;
    Ok(SanType::DnsName(dns))
}

use hcp_fleet_model::names::validate_dns_name;

/// Why a subject alternative name cannot be put in a certificate.
#[derive(Debug, thiserror::Error)]
pub enum SanError {
    #[error(transparent)]
    Name(#[from] hcp_fleet_model::names::DnsNameError),
    #[error("rcgen refused it: {0}")]
    Refused(#[source] rcgen::Error),
}

/// A certificate issued by `ca` for `common_name`.
pub fn issue(
    ca: &KeyedCert,
    common_name: &str,
    usage: &Usage,
    lifetime: Duration,
) -> Result<KeyedCert, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    match usage {
        Usage::Server { sans } => {
            params.subject_alt_names = sans.iter().map(|s| san(s)).collect::<Result<_, _>>()?;
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        Usage::Client { groups } => {
            for g in groups {
                dn.push(DnType::OrganizationName, g.as_str());
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    let (nb, na) = validity(OffsetDateTime::now_utc(), lifetime);
    params.not_before = nb;
    params.not_after = na;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(KeyedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A fresh key pair alone, as (private PKCS#8 PEM, public SPKI PEM), e.g. for signing
/// service-account tokens.
pub fn generate_key_pair_pem() -> Result<(String, String), CertError> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

/// The facts about a certificate that rotation policy needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    pub not_before: i64,
    pub not_after: i64,
    pub(crate) dns_sans: Vec<String>,
    pub(crate) is_ca: bool,
}

/// Reads the first certificate of a PEM blob.
pub fn inspect(cert_pem: &str) -> Result<CertFacts, CertError> {
    let block = pem::parse_many(cert_pem.as_bytes())
        .map_err(|e| CertError::Pem(e.to_string()))?
        .into_iter()
        .find(|p| p.tag() == "CERTIFICATE")
        .ok_or_else(|| CertError::Pem("no CERTIFICATE block".into()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents())
        .map_err(|e| CertError::X509(e.to_string()))?;
    let mut dns_sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(d) => dns_sans.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                        _ => None,
                    };
                    if let Some(ip) = ip {
                        dns_sans.push(ip.to_string());
                    }
                }
                _ => {}
            }
        }
    }
    Ok(CertFacts {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        dns_sans,
        is_ca: cert.is_ca(),
    })
}

/// A per-HCP CA, the CA it replaced (kept in the bundle until it expires, so clients holding
/// either trust the serving certificate during a rotation), and the serving certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertBundle {
    pub(crate) ca: KeyedCert,
    pub(crate) previous_ca_pem: Option<String>,
    pub serving: KeyedCert,
    /// The key the admission service proves its probe answers with (`guards::probe`); `None`
    /// only as read from a Secret written before there was one (the plan adds it).
    pub probe_key: Option<ProbeKey>,
}

use hcp_fleet_guards::probe::KEY_FILE as PROBE_KEY_KEY;

use hcp_fleet_guards::probe::ProbeKey;

fn new_probe_key() -> Result<ProbeKey, CertError> {
    ProbeKey::generate().ok_or(CertError::Random)
}

pub(crate) const CA_CERT_KEY: &str = "ca.crt";
pub(crate) const CA_KEY_KEY: &str = "ca.key";
pub(crate) const PREVIOUS_CA_KEY: &str = "previous-ca.crt";

fn days(d: u32) -> Duration {
    Duration::days(i64::from(d))
}

impl CertBundle {
    pub fn generate(cfg: &crate::config::AgentConfig, sans: &[String]) -> Result<Self, CertError> {
        let ca = generate_ca(
            &agent_ca_name(OffsetDateTime::now_utc()),
            days(cfg.certificates.ca_lifetime_days),
        )?;
        let serving = issue_serving(&ca, cfg, sans)?;
        Ok(Self {
            ca,
            previous_ca_pem: None,
            serving,
            probe_key: Some(new_probe_key()?),
        })
    }

    /// What the hosted webhook configurations carry as caBundle: current CA, then previous.
    pub fn ca_bundle_pem(&self) -> String {
        let mut b = self.ca.cert_pem.clone();
        if let Some(prev) = &self.previous_ca_pem {
            b.push_str(prev);
        }
        b
    }

    /// The agent-only Secret: the CA key never leaves it.
    pub(crate) fn ca_secret_data(&self) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::from([
            (CA_CERT_KEY.to_string(), self.ca.cert_pem.clone()),
            (CA_KEY_KEY.to_string(), self.ca.key_pem.clone()),
        ]);
        if let Some(prev) = &self.previous_ca_pem {
            m.insert(PREVIOUS_CA_KEY.to_string(), prev.clone());
        }
        m
    }

    /// The Secret mounted into the admission pods.
    pub(crate) fn tls_secret_data(&self) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::from([
            ("tls.crt".to_string(), self.serving.cert_pem.clone()),
            ("tls.key".to_string(), self.serving.key_pem.clone()),
            (CA_CERT_KEY.to_string(), self.ca_bundle_pem()),
        ]);
        if let Some(k) = &self.probe_key {
            m.insert(PROBE_KEY_KEY.to_string(), k.to_hex());
        }
        m
    }

    /// Reads a bundle back from the two Secrets' data; `None` if anything is missing or
    /// unparseable (the plan then starts over, which is always safe before first use).
    pub fn from_secret_data(
        ca: &std::collections::BTreeMap<String, Vec<u8>>,
        tls: &std::collections::BTreeMap<String, Vec<u8>>,
    ) -> Option<Self> {
        let s = |m: &std::collections::BTreeMap<String, Vec<u8>>, k: &str| {
            m.get(k).and_then(|v| String::from_utf8(v.clone()).ok())
        };
        let b = Self {
            ca: KeyedCert {
                cert_pem: s(ca, CA_CERT_KEY)?,
                key_pem: s(ca, CA_KEY_KEY)?,
            },
            previous_ca_pem: s(ca, PREVIOUS_CA_KEY),
            serving: KeyedCert {
                cert_pem: s(tls, "tls.crt")?,
                key_pem: s(tls, "tls.key")?,
            },
            probe_key: s(tls, PROBE_KEY_KEY).and_then(|k| ProbeKey::from_hex(&k)),
        };
        inspect(&b.ca.cert_pem).ok()?;
        inspect(&b.serving.cert_pem).ok()?;
        Some(b)
    }
}

fn issue_serving(
    ca: &KeyedCert,
    cfg: &crate::config::AgentConfig,
    sans: &[String],
) -> Result<KeyedCert, CertError> {
    issue(
        ca,
        &serving_common_name(sans),
        &Usage::Server {
            sans: sans.to_vec(),
        },
        days(cfg.certificates.serving_lifetime_days),
    )
}

/// X.509's upper bound for a common name (RFC 5280, ub-common-name).
pub(crate) const MAX_COMMON_NAME: usize = 64;

/// The serving certificate's subject: the first SAN where it fits in 64 characters, else its
/// first label (the Service name). Clients verify the SANs; the subject is for people, and a
/// long ROSA namespace (`ocm-production-<32 hex>-<cluster>`) makes the full name too long.
pub(crate) fn serving_common_name(sans: &[String]) -> String {
    let first = sans
        .first()
        .map(String::as_str)
        .unwrap_or("hcp-fleet-admission");
    if first.len() <= MAX_COMMON_NAME {
        return first.to_string();
    }
    let label = first.split('.').next().unwrap_or(first);
    label.chars().take(MAX_COMMON_NAME).collect()
}

/// Time to renew: less than `percent` of the lifetime left.
pub(crate) fn needs_renewal(facts: &CertFacts, now: i64, percent: u32) -> bool {
    let life = (facts.not_after - facts.not_before).max(1);
    let left = facts.not_after - now;
    left * 100 < life * i64::from(percent)
}

/// When `plan` will next change `bundle` by itself (Unix seconds): the earliest of the CA's
/// and the serving certificate's renewal, and the previous CA's expiry (when it leaves the
/// bundle). Time-driven changes need a reconcile at that moment; nothing else would come.
pub fn next_change(bundle: &CertBundle, percent: u32) -> Option<i64> {
    let due = |pem: &str| {
        inspect(pem).ok().map(|f| {
            let life = (f.not_after - f.not_before).max(1);
            f.not_after - life * i64::from(percent) / 100
        })
    };
    [
        due(&bundle.ca.cert_pem),
        due(&bundle.serving.cert_pem),
        bundle
            .previous_ca_pem
            .as_deref()
            .and_then(|p| inspect(p).ok())
            .map(|f| f.not_after),
    ]
    .into_iter()
    .flatten()
    .min()
}

fn first_der(pem_text: &str) -> Result<Vec<u8>, CertError> {
    bundle_ders(pem_text)
        .into_iter()
        .next()
        .ok_or_else(|| CertError::Pem("no CERTIFICATE block".into()))
}

/// Whether `ca_pem`'s key signed `cert_pem` (signature checked, not names compared: every
/// generation of the agent's CA looks alike by name to a careless client).
pub fn issued_by(cert_pem: &str, ca_pem: &str) -> Result<bool, CertError> {
    let (cert_der, ca_der) = (first_der(cert_pem)?, first_der(ca_pem)?);
    let (_, cert) = x509_parser::parse_x509_certificate(&cert_der)
        .map_err(|e| CertError::X509(e.to_string()))?;
    let (_, ca) =
        x509_parser::parse_x509_certificate(&ca_der).map_err(|e| CertError::X509(e.to_string()))?;
    Ok(cert.verify_signature(Some(ca.public_key())).is_ok())
}

/// The certificate policy: what the bundle should be now, and why it changed (`None` when the
/// existing bundle stands). Pure apart from key generation.
pub fn plan(
    existing: Option<&CertBundle>,
    cfg: &crate::config::AgentConfig,
    sans: &[String],
    now: i64,
) -> Result<(CertBundle, Option<String>), CertError> {
    let pct = cfg.certificates.renew_at_remaining_percent;
    let Some(old) = existing else {
        return Ok((CertBundle::generate(cfg, sans)?, Some("created".into())));
    };
    let (probe_key, key_added) = match &old.probe_key {
        Some(k) => (Some(k.clone()), false),
        None => (Some(new_probe_key()?), true),
    };
    let ca_facts = inspect(&old.ca.cert_pem)?;
    // Drop the previous CA once it has expired: nothing it signed can still be valid.
    let previous = old
        .previous_ca_pem
        .clone()
        .filter(|p| inspect(p).is_ok_and(|f| f.not_after > now));
    if needs_renewal(&ca_facts, now, pct) {
        let ca = generate_ca(
            &agent_ca_name(OffsetDateTime::now_utc()),
            days(cfg.certificates.ca_lifetime_days),
        )?;
        let serving = issue_serving(&ca, cfg, sans)?;
        return Ok((
            CertBundle {
                ca,
                previous_ca_pem: Some(old.ca.cert_pem.clone()),
                serving,
                probe_key,
            },
            Some("CA rotated before expiry; previous CA kept in the bundle".into()),
        ));
    }
    let srv = inspect(&old.serving.cert_pem)?;
    let mut want: Vec<&String> = sans.iter().collect();
    want.sort();
    let mut have: Vec<&String> = srv.dns_sans.iter().collect();
    have.sort();
    // A serving certificate the CA did not sign (a CA Secret restored or replaced on its
    // own) would be served while the hosted side trusts only the CA's bundle: the guard off.
    let reason = if !issued_by(&old.serving.cert_pem, &old.ca.cert_pem)? {
        Some("serving certificate not issued by the current CA")
    } else if want != have {
        Some("serving certificate SANs changed")
    } else if needs_renewal(&srv, now, pct) {
        Some("serving certificate renewed before expiry")
    } else {
        None
    };
    let changed = previous != old.previous_ca_pem;
    match reason {
        Some(r) => Ok((
            CertBundle {
                ca: old.ca.clone(),
                previous_ca_pem: previous,
                serving: issue_serving(&old.ca, cfg, sans)?,
                probe_key,
            },
            Some(r.to_string()),
        )),
        None if changed || key_added => Ok((
            CertBundle {
                previous_ca_pem: previous,
                probe_key,
                ..old.clone()
            },
            Some(
                if changed {
                    "expired previous CA dropped from the bundle"
                } else {
                    "probe key added"
                }
                .into(),
            ),
        )),
        None => Ok((old.clone(), None)),
    }
}

/// The DER of each certificate in a PEM bundle, in order (other blocks and garbage skipped:
/// a bundle read from a live object may hold anything).
pub fn bundle_ders(bundle_pem: &str) -> Vec<Vec<u8>> {
    pem::parse_many(bundle_pem.as_bytes())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| p.into_contents())
        .collect()
}

/// `first`'s certificates, then each of `also`'s that `first` lacks: the trust a client needs
/// while replicas may serve a certificate from either.
pub fn union_bundle(first: &str, also: &str) -> String {
    let mut seen = bundle_ders(first);
    let mut out = first.to_string();
    for der in bundle_ders(also) {
        if !seen.contains(&der) {
            out.push_str(&pem::encode(&pem::Pem::new("CERTIFICATE", der.clone())));
            seen.push(der);
        }
    }
    out
}

/// Whether `bundle` trusts every certificate of `required` (compared by DER).
#[cfg(test)]
pub(crate) fn bundle_contains(bundle: &str, required: &str) -> bool {
    let have = bundle_ders(bundle);
    bundle_ders(required).iter().all(|d| have.contains(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_change_is_the_earliest_renewal_or_expiry() {
        let cfg = crate::config::AgentConfig::default();
        let b = CertBundle::generate(&cfg, &["svc".into()]).expect("bundle");
        let pct = cfg.certificates.renew_at_remaining_percent;
        let serving = inspect(&b.serving.cert_pem).expect("facts");
        let life = serving.not_after - serving.not_before;
        // The serving certificate (30 days) comes due before the CA (a year).
        assert_eq!(
            next_change(&b, pct),
            Some(serving.not_after - life * i64::from(pct) / 100)
        );
        // At that moment the plan does renew it, and not a second before.
        let due = next_change(&b, pct).expect("due");
        let sans = ["svc".to_string()];
        assert!(
            plan(Some(&b), &cfg, &sans, due - 1)
                .expect("plan")
                .1
                .is_none()
        );
        assert!(
            plan(Some(&b), &cfg, &sans, due + 1)
                .expect("plan")
                .1
                .is_some()
        );
        // A previous CA that expires sooner is the next change.
        let short = generate_ca("old", Duration::seconds(60)).expect("old");
        let with_prev = CertBundle {
            previous_ca_pem: Some(short.cert_pem.clone()),
            ..b.clone()
        };
        let prev = inspect(&short.cert_pem).expect("facts");
        assert_eq!(next_change(&with_prev, pct), Some(prev.not_after));
    }

    #[test]
    fn a_union_keeps_the_first_bundle_and_adds_only_what_it_lacks() {
        let a = generate_ca("a", Duration::days(1)).expect("a").cert_pem;
        let b = generate_ca("b", Duration::days(1)).expect("b").cert_pem;
        let c = generate_ca("c", Duration::days(1)).expect("c").cert_pem;
        let first = format!("{a}{b}");
        let u = union_bundle(&first, &format!("{b}{c}garbage"));
        assert!(u.starts_with(&first));
        assert_eq!(bundle_ders(&u).len(), 3);
        assert!(bundle_contains(&u, &c));
        assert!(bundle_contains(&u, &first));
        assert!(!bundle_contains(&first, &c));
        assert_eq!(union_bundle(&first, ""), first);
        assert_eq!(union_bundle(&first, "not a pem"), first);
    }

    #[test]
    fn server_cert_chains_to_ca_and_carries_sans() {
        let ca = generate_ca("test-ca", Duration::days(10)).expect("ca");
        let srv = issue(
            &ca,
            "svc",
            &Usage::Server {
                sans: vec!["svc.ns.svc".into(), "127.0.0.1".into()],
            },
            Duration::days(1),
        )
        .expect("issue");
        let facts = inspect(&srv.cert_pem).expect("inspect");
        assert_eq!(facts.dns_sans, vec!["svc.ns.svc", "127.0.0.1"]);
        assert!(!facts.is_ca);
        assert!(inspect(&ca.cert_pem).expect("ca facts").is_ca);
        let life = facts.not_after - facts.not_before;
        // one day plus the five-minute back-dating
        assert_eq!(life, 86_400 + 300);
    }

    #[test]
    fn invalid_san_is_an_error_not_a_panic() {
        let ca = generate_ca("test-ca", Duration::days(1)).expect("ca");
        let err = issue(
            &ca,
            "x",
            &Usage::Server {
                sans: vec!["bad name with spaces\u{0}".into()],
            },
            Duration::days(1),
        );
        assert!(matches!(err, Err(CertError::InvalidSan { .. })), "{err:?}");
    }

    #[test]
    fn dns_name_rules() {
        assert!(validate_dns_name("svc.clusters-hc-1.svc.cluster.local").is_ok());
        for bad in [
            "",
            "a..b",
            "-a.b",
            "a-.b",
            "UPPER.case",
            "under_score",
            &"x".repeat(64),
        ] {
            assert!(validate_dns_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn inspect_rejects_garbage() {
        assert!(matches!(inspect("hello"), Err(CertError::Pem(_))));
        let bogus = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert!(matches!(inspect(bogus), Err(CertError::X509(_))));
    }

    fn now() -> i64 {
        OffsetDateTime::now_utc().unix_timestamp()
    }

    #[test]
    fn plan_keeps_a_healthy_bundle_untouched() {
        let cfg = crate::config::AgentConfig::default();
        let sans = vec!["a.ns.svc".to_string()];
        let (b, why) = plan(None, &cfg, &sans, now()).expect("create");
        assert_eq!(why.as_deref(), Some("created"));
        let (b2, why2) = plan(Some(&b), &cfg, &sans, now()).expect("keep");
        assert_eq!(why2, None);
        assert_eq!(b, b2);
    }

    #[test]
    fn the_probe_key_outlives_renewals_and_is_added_where_missing() {
        let cfg = crate::config::AgentConfig::default();
        let sans = vec!["a.ns.svc".to_string()];
        let (b, _) = plan(None, &cfg, &sans, now()).expect("create");
        let key = b.probe_key.clone().expect("a new bundle has a probe key");
        // Read back from the Secrets: the key is there, under its file name.
        let bytes = |m: std::collections::BTreeMap<String, String>| {
            m.into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let tls = bytes(b.tls_secret_data());
        assert_eq!(tls.get("probe.key").map(Vec::len), Some(64));
        let read = CertBundle::from_secret_data(&bytes(b.ca_secret_data()), &tls).expect("read");
        assert_eq!(read.probe_key.as_ref(), Some(&key));
        // A renewal (new SANs) and a CA rotation (near expiry) keep it.
        let more = vec!["a.ns.svc".to_string(), "b.ns.svc".to_string()];
        let (renewed, why) = plan(Some(&b), &cfg, &more, now()).expect("renew");
        assert_eq!(why.as_deref(), Some("serving certificate SANs changed"));
        assert_eq!(renewed.probe_key.as_ref(), Some(&key));
        let late = now() + 86_400 * i64::from(cfg.certificates.ca_lifetime_days);
        let (rotated, why) = plan(Some(&b), &cfg, &sans, late).expect("rotate");
        assert!(why.is_some_and(|w| w.starts_with("CA rotated")));
        assert_eq!(rotated.probe_key.as_ref(), Some(&key));
        // A Secret written before there was a key: read without one, and the plan adds it
        // (keeping the certificates: no rotation for an upgrade).
        let mut old_tls = tls.clone();
        old_tls.remove("probe.key");
        let old = CertBundle::from_secret_data(&bytes(b.ca_secret_data()), &old_tls).expect("old");
        assert_eq!(old.probe_key, None);
        let (fixed, why) = plan(Some(&old), &cfg, &sans, now()).expect("add");
        assert_eq!(why.as_deref(), Some("probe key added"));
        assert!(fixed.probe_key.is_some());
        assert_eq!((&fixed.ca, &fixed.serving), (&b.ca, &b.serving));
        // A garbled key reads as none, and is replaced the same way.
        old_tls.insert("probe.key".into(), b"not hex".to_vec());
        let garbled = CertBundle::from_secret_data(&bytes(b.ca_secret_data()), &old_tls);
        assert_eq!(garbled.expect("read").probe_key, None);
    }

    #[test]
    fn plan_reissues_on_san_change_and_near_expiry() {
        let cfg = crate::config::AgentConfig::default();
        let (b, _) = plan(None, &cfg, &["a.ns.svc".to_string()], now()).expect("create");
        let (b2, why) = plan(Some(&b), &cfg, &["b.ns.svc".to_string()], now()).expect("sans");
        assert_eq!(why.as_deref(), Some("serving certificate SANs changed"));
        assert_eq!(b2.ca, b.ca, "same CA");
        assert_ne!(b2.serving, b.serving);
        // 25 of 30 days later, under 33% left: renew the serving cert, keep the CA.
        let later = now() + 25 * 86_400;
        let (b3, why) = plan(Some(&b2), &cfg, &["b.ns.svc".to_string()], later).expect("renew");
        assert_eq!(
            why.as_deref(),
            Some("serving certificate renewed before expiry")
        );
        assert_eq!(b3.ca, b2.ca);
    }

    #[test]
    fn a_serving_certificate_from_another_ca_is_reissued_from_the_current_one() {
        let cfg = crate::config::AgentConfig::default();
        let sans = vec!["a.ns.svc".to_string()];
        let (old, _) = plan(None, &cfg, &sans, now()).expect("old");
        let (new, _) = plan(None, &cfg, &sans, now()).expect("new");
        assert!(issued_by(&old.serving.cert_pem, &old.ca.cert_pem).expect("parse"));
        assert!(!issued_by(&old.serving.cert_pem, &new.ca.cert_pem).expect("parse"));
        // The CA Secret replaced on its own: the new CA, the old serving certificate.
        let mixed = CertBundle {
            ca: new.ca.clone(),
            previous_ca_pem: None,
            serving: old.serving.clone(),
            probe_key: new.probe_key.clone(),
        };
        let (fixed, why) = plan(Some(&mixed), &cfg, &sans, now()).expect("plan");
        assert_eq!(
            why.as_deref(),
            Some("serving certificate not issued by the current CA")
        );
        assert_eq!(fixed.ca, new.ca, "the CA stands");
        assert!(issued_by(&fixed.serving.cert_pem, &fixed.ca.cert_pem).expect("parse"));
        assert!(matches!(
            issued_by("garbage", &new.ca.cert_pem),
            Err(CertError::Pem(_))
        ));
    }

    #[test]
    fn subjects_fit_in_64_characters_on_long_rosa_namespaces() {
        let ns = format!("ocm-production-{}-hc", "0123456789abcdef".repeat(2));
        let sans = vec![
            format!("hcp-fleet-admission.{ns}.svc"),
            format!("hcp-fleet-admission.{ns}.svc.cluster.local"),
        ];
        assert!(sans[0].len() > MAX_COMMON_NAME);
        assert_eq!(serving_common_name(&sans), "hcp-fleet-admission");
        let short = vec!["hcp-fleet-admission.ns.svc".to_string()];
        assert_eq!(serving_common_name(&short), short[0]);
        // The certificate itself: issued, subject within bounds, every long SAN kept.
        let cfg = crate::config::AgentConfig::default();
        let b = CertBundle::generate(&cfg, &sans).expect("bundle");
        let der = bundle_ders(&b.serving.cert_pem).remove(0);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("parse");
        for cn in cert.subject().iter_common_name() {
            assert!(cn.as_str().expect("utf8").len() <= MAX_COMMON_NAME);
        }
        let ca_der = bundle_ders(&b.ca.cert_pem).remove(0);
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("parse");
        for cn in ca.subject().iter_common_name() {
            assert!(cn.as_str().expect("utf8").len() <= MAX_COMMON_NAME);
        }
        assert_eq!(inspect(&b.serving.cert_pem).expect("facts").dns_sans, sans);
    }

    #[test]
    fn every_ca_generation_has_its_own_name() {
        let t = OffsetDateTime::from_unix_timestamp(1_795_000_000).expect("time");
        assert_eq!(
            agent_ca_name(t),
            "hcp-fleet-admission CA 2026-11-18T11:06:40Z"
        );
        assert_ne!(agent_ca_name(t), agent_ca_name(t + Duration::seconds(1)));
    }

    #[test]
    fn ca_rotation_keeps_the_old_ca_in_the_bundle_until_it_expires() {
        let cfg = crate::config::AgentConfig::default();
        let sans = vec!["a.ns.svc".to_string()];
        let (b, _) = plan(None, &cfg, &sans, now()).expect("create");
        let late = now() + 300 * 86_400; // under a third of 365 days left
        let (r, why) = plan(Some(&b), &cfg, &sans, late).expect("rotate");
        assert!(why.expect("changed").contains("CA rotated"));
        assert_ne!(r.ca, b.ca);
        let bundle = r.ca_bundle_pem();
        assert!(bundle.contains(&b.ca.cert_pem) && bundle.contains(&r.ca.cert_pem));
        // After the old CA's expiry it is dropped.
        let after = now() + 400 * 86_400;
        let (d, why) = plan(Some(&r), &cfg, &sans, after).expect("drop");
        assert!(!d.ca_bundle_pem().contains(&b.ca.cert_pem), "{why:?}");
    }

    #[test]
    fn bundle_round_trips_through_secret_data() {
        let cfg = crate::config::AgentConfig::default();
        let b = CertBundle::generate(&cfg, &["a.ns.svc".to_string()]).expect("gen");
        let to_bytes = |m: std::collections::BTreeMap<String, String>| {
            m.into_iter().map(|(k, v)| (k, v.into_bytes())).collect()
        };
        let back = CertBundle::from_secret_data(
            &to_bytes(b.ca_secret_data()),
            &to_bytes(b.tls_secret_data()),
        );
        assert_eq!(back, Some(b));
        assert_eq!(
            CertBundle::from_secret_data(&Default::default(), &Default::default()),
            None
        );
    }

    #[test]
    fn debug_never_prints_keys() {
        let ca = generate_ca("test-ca", Duration::days(1)).expect("ca");
        let dbg = format!("{ca:?}");
        assert!(!dbg.contains("PRIVATE KEY"));
    }
}
