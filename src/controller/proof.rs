//! What makes an answer to the probe, or to a canary, the admission service's own and not an
//! imitation by something the hosted cluster's admins installed: pure, shared by the probe,
//! the canaries and the state they keep between rounds.

use crate::catalogue::{POLICY_PROBE_ANSWER, PROBE_ANSWER};
use crate::guards::probe::{PROOF_MARK, ProbeKey};
use crate::hosted::admission_policies::Engine;

/// What makes a webhook answer to the probe the admission service's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proof {
    /// The HCP's probe key (from its TLS Secret); `None` only in tests, where the words are
    /// all there is to check.
    pub key: Option<ProbeKey>,
    /// The admission Deployment is rolling out: replicas of an agent version from before the
    /// probe key answer without a proof, and an answer in the right words is taken as theirs
    /// until every replica runs the current spec (a tenant's imitation passes only meanwhile).
    pub rolling_out: bool,
}

/// How a denial of the probe reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The agent's own answer, proven.
    Proven,
    /// The right words without the proof, while the Deployment rolls out (see `Proof`).
    Unproven,
    /// Not the agent's answer.
    Imitation,
}

/// Whether a denial of the probe of `engine` is the agent's own answer, and not an imitation
/// by something the hosted cluster's admins installed (see `judge`).
pub(crate) fn authentic(engine: Engine, message: &str, proof: &Proof, nonce: &str) -> Answer {
    let words = match engine {
        Engine::Webhook => PROBE_ANSWER,
        Engine::Policy => POLICY_PROBE_ANSWER,
    };
    judge(
        engine,
        crate::guards::probe::ROW.name,
        words,
        message,
        proof,
        nonce,
    )
}

/// Whether a denial came from the agent's guard `name` on `engine`, beginning with `words`. A
/// policy's denial names the policy and its binding (a tenant cannot hold either name while
/// the agent's objects hold it, and a webhook's denial cannot begin so); a webhook's denial
/// names a webhook, which anyone can name alike, so it must end with the proof of this
/// request's nonce under the HCP's probe key.
pub fn judge(
    engine: Engine,
    name: &str,
    words: &str,
    message: &str,
    proof: &Proof,
    nonce: &str,
) -> Answer {
    let said = match engine {
        Engine::Webhook => format!("admission webhook \"{name}\" denied the request: {words}"),
        Engine::Policy => {
            format!(
                "ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {words}"
            )
        }
    };
    if !message.starts_with(&said) {
        return Answer::Imitation;
    }
    match (engine, &proof.key) {
        (Engine::Policy, _) | (Engine::Webhook, None) => Answer::Proven,
        (Engine::Webhook, Some(k)) if k.proven(nonce, message) => Answer::Proven,
        (Engine::Webhook, Some(_)) if proof.rolling_out && !message.contains(PROOF_MARK) => {
            Answer::Unproven
        }
        (Engine::Webhook, Some(_)) => Answer::Imitation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guards::probe::{answer, nonce};

    #[test]
    fn only_the_agents_own_answer_proves_the_path() {
        let key = ProbeKey::generate().expect("random");
        let n = nonce().expect("random");
        let name = crate::guards::probe::ROW.name;
        let hook =
            |text: String| format!("admission webhook \"{name}\" denied the request: {text}");
        let proof = |rolling_out| Proof {
            key: Some(key.clone()),
            rolling_out,
        };
        let proven = hook(answer(Some(&key), Some(&n)));
        let words = hook(answer(None, None));
        let other = ProbeKey::generate().expect("random");
        let forged = hook(answer(Some(&other), Some(&n)));
        let w = Engine::Webhook;
        assert_eq!(authentic(w, &proven, &proof(false), &n), Answer::Proven);
        assert_eq!(authentic(w, &words, &proof(false), &n), Answer::Imitation);
        assert_eq!(authentic(w, &forged, &proof(false), &n), Answer::Imitation);
        // While the Deployment rolls out, the words alone are taken (an old replica), but
        // never a wrong proof.
        assert_eq!(authentic(w, &words, &proof(true), &n), Answer::Unproven);
        assert_eq!(authentic(w, &forged, &proof(true), &n), Answer::Imitation);
        // Another webhook's name, or the words inside another message.
        let renamed = proven.replace(name, "probe.tenant.example.com");
        assert_eq!(authentic(w, &renamed, &proof(false), &n), Answer::Imitation);
        let inside = format!("admission webhook \"x\" denied the request: {proven}");
        assert_eq!(authentic(w, &inside, &proof(true), &n), Answer::Imitation);
        // A policy's denial names the agent's policy and binding; a webhook cannot say so.
        let p = Engine::Policy;
        let by_policy = format!(
            "ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: {POLICY_PROBE_ANSWER}"
        );
        assert_eq!(authentic(p, &by_policy, &proof(false), &n), Answer::Proven);
        let by_hook = hook(POLICY_PROBE_ANSWER.into());
        assert_eq!(authentic(p, &by_hook, &proof(false), &n), Answer::Imitation);
        let other_policy = by_policy.replacen(name, "tenant-probe", 2);
        assert_eq!(
            authentic(p, &other_policy, &proof(false), &n),
            Answer::Imitation
        );
    }
}
