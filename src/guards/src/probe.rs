//! The end-to-end probe: a ConfigMap carrying the probe label is always denied, whatever the
//! mode or the identity, so the agent's dry-run create proves that the hosted kube-apiserver
//! reaches the admission service. It stays a webhook: only a call to the service proves that.
//!
//! A denial proves nothing by its text alone: a hosted cluster's admin can install a webhook
//! of their own that denies probe-labelled ConfigMaps with the same words (webhook names are
//! theirs to choose), and then the probe would stay green with the agent's guards cut off. So
//! the agent puts a fresh nonce on every probe and the service answers with an HMAC of it under
//! the HCP's probe key, which lives in the management-side TLS Secret mounted into the
//! service's pods and nowhere in the hosted cluster. Only a service that holds the key can
//! answer; the agent holds the same Secret and checks the proof.

use std::sync::Arc;

use crate::crypto::rand::SecureRandom;

use crate::crypto::rand::SystemRandom;
use crate::crypto::{hex, hmac};
use serde_json::{Value, json};

use super::Settings;
use super::case::{Case, Want};
use super::{CelForm, Guard, Scope};
use crate::catalogue::{BuiltinRow, PROBE_ANSWER, PROBE_LABEL, WebhookKind, rule};
use crate::review::{Decision, Request};
use hcp_fleet_model::Mode;

pub(crate) struct Probe;

pub static ROW: BuiltinRow = BuiltinRow {
    name: "probe.hcp-fleet.openshift.io",
    kind: WebhookKind::Validating,
    path: "/validate/probe",
    rules: &[rule(&["CREATE"], &[""], &["configmaps"])],
    mode: Mode::Enforce,
    only_labelled: Some(PROBE_LABEL),
};

/// The annotation on a probe ConfigMap carrying the agent's nonce for this probe.
pub const NONCE_ANNOTATION: &str = "hcp-fleet.openshift.io/probe-nonce";
/// The key of the probe key in the TLS Secret, and so the file in the service's cert dir.
pub const KEY_FILE: &str = "probe.key";
/// What precedes the proof in the service's answer.
pub const PROOF_MARK: &str = " (proof ";

/// An HCP's probe key: 32 random bytes, kept as 64 hex characters in the TLS Secret. It
/// outlives certificate renewals and CA rotations (a key that changed with the certificate
/// would fail the probe for as long as the pods' mounted copy lags the Secret).
#[derive(Clone, PartialEq, Eq)]
pub struct ProbeKey(Arc<[u8]>);

impl std::fmt::Debug for ProbeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbeKey(<redacted>)")
    }
}

fn random_bytes<const N: usize>() -> Option<[u8; N]> {
    let mut b = [0u8; N];
    SystemRandom::new().fill(&mut b).ok()?;
    Some(b)
}

impl ProbeKey {
    /// A new key; `None` only if the system's random source fails.
    pub fn generate() -> Option<Self> {
        Some(Self(Arc::from(random_bytes::<32>()?.as_slice())))
    }

    /// The key as stored (hex).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// A stored key; `None` unless it is exactly 64 hex characters (surrounding whitespace
    /// allowed: a file edited by hand ends with a newline).
    pub fn from_hex(text: &str) -> Option<Self> {
        let t = text.trim();
        if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..32)
            .map(|i| u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
        Some(Self(Arc::from(bytes?.as_slice())))
    }

    /// The proof for `nonce` and the text it vouches for (`covered`, empty for none):
    /// HMAC-SHA256, hex. With nothing covered it is the proof of the nonce alone (a probe's
    /// answer, a canary's denial); a report covers its own words too, so neither passes for
    /// the other.
    pub(crate) fn prove(&self, nonce: &str, covered: &str) -> String {
        let k = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let tag = if covered.is_empty() {
            hmac::sign(&k, nonce.as_bytes())
        } else {
            hmac::sign(&k, format!("{nonce}\n{covered}").as_bytes())
        };
        hex(tag.as_ref())
    }

    /// Whether `message` (a denial as the API server relays it) ends with the proof of
    /// `nonce`.
    pub fn proven(&self, nonce: &str, message: &str) -> bool {
        message.ends_with(&self.suffix(nonce, ""))
    }

    /// Whether `value` (a mutation canary's `canary::PROOF_ANNOTATION`) is the proof of
    /// `nonce`.
    pub fn proves(&self, nonce: &str, value: &str) -> bool {
        value == self.prove(nonce, "")
    }

    /// What ends a message this key vouches for: `PROOF_MARK`, the proof of `nonce` and
    /// `covered`, and the closing parenthesis.
    fn suffix(&self, nonce: &str, covered: &str) -> String {
        format!("{PROOF_MARK}{})", self.prove(nonce, covered))
    }

    /// A replica's report of the cluster's own requests it denied lately (`own_denials`),
    /// where its proof vouches for it under `nonce`: the pairs as the replica wrote them
    /// ("" for none). `None`: not a report this key made for this nonce.
    pub fn report<'m>(&self, nonce: &str, text: &'m str) -> Option<&'m str> {
        let end = text.rfind(PROOF_MARK)?;
        let covered = text.get(..end)?;
        let pairs = covered.strip_prefix(REPORT_MARK)?;
        (text.get(end..)? == self.suffix(nonce, covered)).then_some(pairs)
    }
}

/// A fresh nonce for one probe (hex of 16 random bytes); `None` only if the system's random
/// source fails.
pub fn nonce() -> Option<String> {
    random_bytes::<16>().map(|b| hex(&b))
}

/// `n`, if it is a nonce the agent could have made.
pub fn a_nonce(n: &str) -> Option<&str> {
    // Hex, at most 64 characters: a tenant gets no proof for text of their choosing.
    (!n.is_empty() && n.len() <= 64 && n.bytes().all(|b| b.is_ascii_hexdigit())).then_some(n)
}

/// The nonce a request carries, if it is one the agent could have made: a probe's in its
/// annotation, a canary's in its user's extra (`canary::NONCE_EXTRA`).
pub fn nonce_of<'a>(req: &'a Request<'_>) -> Option<&'a str> {
    // Asked of every review the service answers: the label read from the text first, so the
    // object of a review no guard read is not built into a tree here.
    if labelled(req) && is_probe(req) {
        let o = req.object()?;
        return a_nonce(o["metadata"]["annotations"][NONCE_ANNOTATION].as_str()?);
    }
    let extra = &req.user_info.extra;
    let values = extra.get(super::canary::NONCE_EXTRA)?;
    match values.as_slice() {
        [n] => a_nonce(n),
        _ => None,
    }
}

/// A denial's message with the proof of `nonce` under `key` after it.
pub fn signed(message: &str, key: &ProbeKey, nonce: &str) -> String {
    format!("{message}{}", key.suffix(nonce, ""))
}

/// Where each admission replica answers, to the agent and to no API server, which of the
/// hosted cluster's own requests it denied lately (`OwnDenials` in the admission service):
/// `GET /own-denials?nonce=<hex>`. Asked of every replica, since each knows only what it
/// denied, and the hosted kube-apiserver's calls (the probe's among them) may all go to one.
pub const OWN_DENIALS_PATH: &str = "/own-denials";

/// What begins a replica's report: the guards and senders of the hosted cluster's own
/// requests it denied lately, then the proof, which covers them, so the agent can put them on
/// the health record: only a holder of the HCP's probe key can write a report.
pub const REPORT_MARK: &str = "denied the hosted cluster's own requests in the last 10 minutes: ";
/// How long a denial of the cluster's own requests stays in the report: the alert's window
/// (`increase(...[10m])`), the same 10 minutes `REPORT_MARK` names.
pub const REPORT_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// The service's answer to a probe: `PROBE_ANSWER`, with the proof of the nonce where the
/// request carries a nonce and the service holds the key.
pub fn answer(key: Option<&ProbeKey>, nonce: Option<&str>) -> String {
    match (key, nonce) {
        (Some(k), Some(n)) => format!("{PROBE_ANSWER}{}", k.suffix(n, "")),
        _ => PROBE_ANSWER.to_string(),
    }
}

/// A replica's report (`OWN_DENIALS_PATH`): `REPORT_MARK`, the pairs it denied lately
/// ("<webhook> denied <sender>" each; none, nothing), and the proof of `nonce` and all that.
pub fn own_denials(key: &ProbeKey, nonce: &str, denied: &[String]) -> String {
    let covered = format!("{REPORT_MARK}{}", denied.join(", "));
    let proof = key.suffix(nonce, &covered);
    format!("{covered}{proof}")
}

pub(crate) fn is_probe(req: &Request) -> bool {
    req.object()
        .and_then(|o| o["metadata"]["labels"][PROBE_LABEL].as_str())
        == Some("true")
}

/// The probe label, read from the object's text without building its tree
/// (`Request::object_str_at`): true wherever `is_probe` is, which reads the same label from
/// the tree.
fn labelled(req: &Request) -> bool {
    req.object_str_at(&["metadata", "labels", PROBE_LABEL])
        .is_some_and(|v| v == "true")
}

impl Guard for Probe {
    fn row(&self) -> &'static BuiltinRow {
        &ROW
    }

    fn decide(&self, req: &Request, _: &Settings) -> Decision {
        if is_probe(req) {
            Decision::deny(PROBE_ANSWER)
        } else {
            Decision::allow()
        }
    }

    fn cel(&self, _: &Settings) -> Option<CelForm> {
        None
    }

    fn scope(&self) -> Scope {
        Scope::Everyone
    }

    fn cases(&self) -> Vec<Case> {
        use Want::*;
        let cm = |labels: Value| json!({"metadata": {"name": "p", "labels": labels}});
        let create = ("CREATE", "", "configmaps", "p");
        vec![
            Case::new("a labelled ConfigMap", Deny, create)
                .namespaced("default")
                .objects(cm(json!({PROBE_LABEL: "true"})), Value::Null),
            Case::new("a labelled ConfigMap by an exempt user", Deny, create)
                .namespaced("default")
                .objects(cm(json!({PROBE_LABEL: "true"})), Value::Null)
                .by("system:admin", &["system:masters"]),
            Case::new("another label value", Allow, create)
                .namespaced("team-a")
                .objects(cm(json!({PROBE_LABEL: "yes"})), Value::Null),
            Case::new("no label", Allow, create)
                .namespaced("team-a")
                .objects(cm(json!({})), Value::Null),
        ]
    }
}

/// In a probe's message: the denial came from something other than the agent's service (a
/// webhook of the hosted cluster's own). Not the revision's doing (`rollout::attributable`).
pub const FOREIGN_ANSWER: &str = "something other than the agent's service answered it";
/// The same, on the policy path.
pub const FOREIGN_POLICY_ANSWER: &str = "was not answered by the agent's probe policy";
/// In a probe's message: the hosted kube-apiserver held the request past the agent's timeout.
/// The agent's own webhooks time out sooner (5 s at most) and let requests through, so
/// something of the hosted cluster's held it.
pub const NO_ANSWER: &str = "got no answer within";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_is_made_only_with_the_key_and_for_the_nonce_asked() {
        let key = ProbeKey::generate().expect("random");
        let other = ProbeKey::generate().expect("random");
        assert_ne!(key, other);
        assert_eq!(
            ProbeKey::from_hex(&format!("{}\n", key.to_hex())),
            Some(key.clone())
        );
        for bad in ["", "zz", &"a".repeat(63), &"g".repeat(64), &"a".repeat(66)] {
            assert_eq!(ProbeKey::from_hex(bad), None, "{bad:?}");
        }
        let n = nonce().expect("random");
        assert_eq!(n.len(), 32);
        let said =
            |a: String| format!("admission webhook \"{}\" denied the request: {a}", ROW.name);
        assert!(key.proven(&n, &said(answer(Some(&key), Some(&n)))));
        // The words alone, another key's proof, another nonce's proof: none of them.
        assert!(!key.proven(&n, &said(answer(None, Some(&n)))));
        assert!(!key.proven(&n, &said(answer(Some(&other), Some(&n)))));
        let m = nonce().expect("random");
        assert!(!key.proven(&n, &said(answer(Some(&key), Some(&m)))));
        // A proof followed by anything else is not the service's answer.
        assert!(!key.proven(
            &n,
            &format!("{} and more", said(answer(Some(&key), Some(&n))))
        ));
        assert_eq!(format!("{key:?}"), "ProbeKey(<redacted>)");
    }

    #[test]
    fn a_report_is_taken_only_under_the_proof_of_its_own_words() {
        let key = ProbeKey::generate().expect("random");
        let n = nonce().expect("random");
        let denied = vec![
            "identity-namespaces.hcp-fleet.openshift.io denied node".to_string(),
            "scc.hcp-fleet.openshift.io denied platformOperators".to_string(),
        ];
        let report = own_denials(&key, &n, &denied);
        assert_eq!(key.report(&n, &report), Some(denied.join(", ").as_str()));
        // Nothing denied is a report too, proven as any other.
        assert_eq!(key.report(&n, &own_denials(&key, &n, &[])), Some(""));
        // Edited, shortened, under another nonce or key: no report.
        let edited = report.replace("denied node", "denied tenant");
        assert_eq!(key.report(&n, &edited), None);
        let stripped = report.replacen(&denied[1], "", 1);
        assert_eq!(key.report(&n, &stripped), None);
        let m = nonce().expect("random");
        assert_eq!(key.report(&m, &report), None);
        let other = ProbeKey::generate().expect("random");
        assert_eq!(other.report(&n, &report), None);
        // A probe's answer is no report, and a report no probe's answer: their proofs differ.
        let answered = answer(Some(&key), Some(&n));
        assert_eq!(key.report(&n, &answered), None);
        assert_eq!(
            key.report(&n, &format!("{REPORT_MARK}{}", key.suffix(&n, ""))),
            None
        );
        assert!(!key.proven(&n, &report));
    }

    #[test]
    fn only_a_nonce_the_agent_could_have_made_is_proven() {
        let req = |nonce: &str| {
            let r = Case::new("probe", Want::Deny, ("CREATE", "", "configmaps", "p"))
                .namespaced("default")
                .objects(
                    json!({"metadata": {"name": "p", "labels": {PROBE_LABEL: "true"},
                        "annotations": {NONCE_ANNOTATION: nonce}}}),
                    Value::Null,
                )
                .review();
            let r = crate::review::decode(&r).expect("a review");
            nonce_of(&r).map(str::to_string)
        };
        assert_eq!(req("0a1b").as_deref(), Some("0a1b"));
        assert_eq!(req(""), None);
        assert_eq!(req("not hex"), None);
        assert_eq!(req(&"a".repeat(65)), None);
    }

    #[test]
    fn asking_a_review_for_its_nonce_builds_no_tree_of_an_object_that_is_no_probe() {
        // 1e400 is JSON no tree holds: were the tree built, the review would be unreadable.
        let body = |labels: &str| {
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","kind":{{"group":"","version":"v1","kind":"ConfigMap"}},"resource":{{"group":"","version":"v1","resource":"configmaps"}},"operation":"CREATE","userInfo":{{"username":"alice"}},"object":{{"metadata":{{"name":"p","labels":{labels}}},"data":{{"n":1e400}}}}}}}}"#
            )
        };
        let plain = body("{}");
        let r = crate::review::decode(plain.as_bytes()).expect("a review");
        assert_eq!(nonce_of(&r), None);
        assert_eq!(r.unreadable(), None, "the object was not built");
        // A labelled one is read whole, as the probe's guard reads it: unreadable, so no probe.
        let labelled = body(&format!(r#"{{"{PROBE_LABEL}":"true"}}"#));
        let r = crate::review::decode(labelled.as_bytes()).expect("a review");
        assert_eq!(nonce_of(&r), None);
        assert!(r.unreadable().is_some(), "the object was built, and fails");
        assert!(!is_probe(&r));
    }
}
