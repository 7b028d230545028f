//! The admission policies every hosted cluster shares, rendered once per configuration and
//! not once per HCP. A restarted agent renders the guards of every HCP it holds, and at 3,000
//! HCPs that rendering (each guard's CEL and exemptions written, the objects typed) was a
//! sixth of its CPU until every HCP was found Compliant again (`make bench`, the scale
//! benchmark, perf), for objects that differ between HCPs only in their namespace annotation
//! and in the probe's revision.
//!
//! So the guards' policies and bindings are rendered once for a stand-in namespace (`SLOT`),
//! and each HCP's are those with its namespace written in: the same objects, and the same
//! revision (the set's text is the stand-in's with each `SLOT` replaced, byte for byte what
//! `admission_policies::revision_of` hashes), then the probe of that revision. Tests hold every
//! HCP's rendering to `admission_policies::render_alone`.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::core::{DynamicObject, ObjectMeta};
use serde_json::Value;

use super::admission_policies::{self as policies, AdmissionPolicies};
use super::objects::{HCP_NAMESPACE_ANNOTATION, HostedFeatures, WebhookRenderError};
use crate::config::AgentConfig;
use hcp_fleet_guards::Settings;

/// Stands for the HCP namespace in the shared rendering. A NUL is in no namespace's name (a
/// DNS label) and the guards' texts hold none; should a configuration's text ever hold this,
/// the count of it in the set's text says so and the HCPs are rendered one by one.
const SLOT: &str = "\u{0}hcp-namespace\u{0}";

/// `SLOT` as a JSON string, as serde_json writes it into the set's text.
const SLOT_JSON: &str = "\"\\u0000hcp-namespace\\u0000\"";

/// Renderings kept: one per configuration and what the hosted clusters serve (a fleet of a
/// few Kubernetes versions, or one whose hosted registries differ, has a few at once).
const KEPT: usize = 16;

static KEPT_RENDERINGS: LazyLock<Kept> = LazyLock::new(Kept::default);

/// The shared rendering for `cfg`, `settings` and `features`, made at its first use; `None`
/// where it cannot stand for each HCP's (`Shared::new`).
pub(crate) fn of(
    cfg: &AgentConfig,
    settings: &Settings,
    features: HostedFeatures,
) -> Option<Arc<Shared>> {
    KEPT_RENDERINGS.get(cfg, settings, features)
}

/// The renderings kept, the latest used last.
#[derive(Default)]
struct Kept(Mutex<Vec<Arc<Shared>>>);

impl Kept {
    fn get(
        &self,
        cfg: &AgentConfig,
        settings: &Settings,
        features: HostedFeatures,
    ) -> Option<Arc<Shared>> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = kept.iter().position(|s| s.is_for(cfg, settings, features)) {
            // The latest used last, so the one evicted is the one used longest ago.
            let shared = kept.remove(at);
            kept.push(Arc::clone(&shared));
            return Some(shared);
        }
        // Made under the lock: the reconciles that wait want the same one.
        let shared = Arc::new(Shared::new(cfg, settings, features)?);
        if kept.len() >= KEPT {
            kept.remove(0);
        }
        kept.push(Arc::clone(&shared));
        Some(shared)
    }
}

/// One set (validating, or mutating) rendered for `SLOT`: its objects, and its text as
/// `revision_of` writes it, cut at each `SLOT` (`None`: an empty set), so an HCP's text is the
/// pieces joined by its namespace.
struct Set<P, B> {
    policies: Vec<P>,
    bindings: Vec<B>,
    pieces: Option<Vec<String>>,
}

pub(crate) struct Shared {
    cfg: AgentConfig,
    settings: Settings,
    features: HostedFeatures,
    validating: Set<ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding>,
    mutating: Set<DynamicObject, DynamicObject>,
}

impl Shared {
    fn is_for(&self, cfg: &AgentConfig, settings: &Settings, features: HostedFeatures) -> bool {
        self.features == features && self.settings == *settings && self.cfg == *cfg
    }

    /// The guards' policies and bindings for `SLOT`, or `None` where an HCP's could not be
    /// made from them: an object that does not type (the HCP's own rendering says why, with
    /// its namespace), or `SLOT` found in the text other than once per object.
    fn new(cfg: &AgentConfig, settings: &Settings, features: HostedFeatures) -> Option<Self> {
        let (policies, bindings) = policies::guard_set(
            cfg,
            settings,
            SLOT,
            policies::on_policies(cfg, features),
            "",
        );
        // Each set's text in the order its revision is taken: the validating policies, then
        // their bindings (`render_set`); each mutating policy and its binding in turn
        // (`with_mutating_probe`).
        let text = policies::set_text(policies.iter().chain(&bindings));
        let validating = Set::of(policies, bindings, text)?;
        let pairs = policies::guard_mutations(cfg, settings, SLOT, features);
        let text = policies::set_text(pairs.iter().flat_map(|(p, b)| [p, b]));
        let (policies, bindings) = pairs.into_iter().unzip();
        let mutating = Set::of(policies, bindings, text)?;
        Some(Self {
            cfg: cfg.clone(),
            settings: settings.clone(),
            features,
            validating,
            mutating,
        })
    }

    /// What `admission_policies::render_alone` renders for `hcp_namespace`.
    pub(crate) fn for_namespace(
        &self,
        hcp_namespace: &str,
    ) -> Result<AdmissionPolicies, WebhookRenderError> {
        let err = |e: serde_json::Error| WebhookRenderError {
            namespace: hcp_namespace.to_string(),
            reason: e.to_string(),
        };
        let (mut policies, mut bindings, revision) = self.validating.for_namespace(hcp_namespace);
        if let Some(rev) = &revision {
            let (policy, binding) = policies::probe("", hcp_namespace, rev);
            policies.push(serde_json::from_value(policy).map_err(err)?);
            bindings.push(serde_json::from_value(binding).map_err(err)?);
        }
        let (mut mutating, mut mutating_bindings, mutating_revision) =
            self.mutating.for_namespace(hcp_namespace);
        if let Some(rev) = &mutating_revision {
            let (policy, binding) = policies::mutating_probe(hcp_namespace, rev);
            mutating.push(serde_json::from_value(policy).map_err(err)?);
            mutating_bindings.push(serde_json::from_value(binding).map_err(err)?);
        }
        Ok(AdmissionPolicies {
            policies,
            bindings,
            revision,
            mutating,
            mutating_bindings,
            mutating_revision,
        })
    }
}

/// An object whose namespace annotation can be written.
trait Annotated: Clone + serde::de::DeserializeOwned {
    fn meta(&mut self) -> &mut ObjectMeta;
}

impl Annotated for ValidatingAdmissionPolicy {
    fn meta(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Annotated for ValidatingAdmissionPolicyBinding {
    fn meta(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Annotated for DynamicObject {
    fn meta(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl<P: Annotated, B: Annotated> Set<P, B> {
    /// The set of `policies` and `bindings` rendered for `SLOT`, typed, with its `text`;
    /// `None` where one does not type or the text holds `SLOT` other than once per object.
    fn of(policies: Vec<Value>, bindings: Vec<Value>, text: Option<Vec<u8>>) -> Option<Self> {
        let pieces = match text {
            Some(text) => {
                let text = String::from_utf8(text).ok()?;
                let pieces: Vec<String> = text.split(SLOT_JSON).map(str::to_string).collect();
                // One cut per object: its namespace annotation, and nothing else.
                if pieces.len() != policies.len() + bindings.len() + 1 {
                    return None;
                }
                Some(pieces)
            }
            None => None,
        };
        Some(Self {
            policies: typed(policies)?,
            bindings: typed(bindings)?,
            pieces,
        })
    }

    /// The set for `hcp_namespace` and its revision.
    fn for_namespace(&self, hcp_namespace: &str) -> (Vec<P>, Vec<B>, Option<String>) {
        let revision = self.pieces.as_ref().map(|pieces| {
            let name = serde_json::to_string(hcp_namespace).unwrap_or_default();
            policies::revision_of_text(pieces.join(&name).as_bytes())
        });
        (
            annotated(&self.policies, hcp_namespace),
            annotated(&self.bindings, hcp_namespace),
            revision,
        )
    }
}

fn typed<T: serde::de::DeserializeOwned>(values: Vec<Value>) -> Option<Vec<T>> {
    values
        .into_iter()
        .map(|v| serde_json::from_value(v).ok())
        .collect()
}

/// Copies of `objects` with `hcp_namespace` as their namespace annotation.
fn annotated<T: Annotated>(objects: &[T], hcp_namespace: &str) -> Vec<T> {
    objects
        .iter()
        .map(|o| {
            let mut o = o.clone();
            o.meta().annotations.get_or_insert_default().insert(
                HCP_NAMESPACE_ANNOTATION.to_string(),
                hcp_namespace.to_string(),
            );
            o
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosted::admission_policies::render_alone;
    use hcp_fleet_guards::catalogue::GuardEngine;
    use hcp_fleet_model::Mode;

    fn served() -> HostedFeatures {
        HostedFeatures {
            admission_policies: true,
            match_conditions: true,
            mutating_policies: true,
            ..HostedFeatures::default()
        }
    }

    /// Configurations that render differently: the default, every guard in warn mode, some
    /// off, some asking for the webhook, and a second layer of static guards.
    fn configurations() -> Vec<AgentConfig> {
        let default = AgentConfig::default();
        let mut warn = default.clone();
        for w in &mut warn.webhooks {
            w.mode = Mode::Warn;
        }
        let mut mixed = default.clone();
        for (i, w) in mixed.webhooks.iter_mut().enumerate() {
            match i % 3 {
                0 => w.mode = Mode::Off,
                1 => w.engine = GuardEngine::Webhook,
                _ => {}
            }
        }
        let mut second = default.clone();
        second.static_guards.second_layer = true;
        vec![default, warn, mixed, second]
    }

    /// Every HCP's rendering from the shared one is the one made for it alone: the same
    /// objects, the same revisions, for namespaces of every shape (a JSON escape in one too,
    /// which no namespace has but the text's replacement must still get right).
    #[test]
    fn each_hcps_policies_are_those_rendered_for_it_alone() {
        let features = [
            served(),
            HostedFeatures {
                mutating_policies: false,
                ..served()
            },
            HostedFeatures::default(),
            HostedFeatures {
                static_offered: true,
                static_guards: true,
                static_mutating: true,
                ..served()
            },
        ];
        let registry = hcp_fleet_guards::pod_image_spec::InternalRegistry {
            management_state: Some("Removed".into()),
            tags: [(
                "cli:latest".to_string(),
                "quay.io/x/cli@sha256:1".to_string(),
            )]
            .into(),
        };
        let mut checked = 0;
        for cfg in configurations() {
            for registry in [None, Some(registry.clone())] {
                let settings = Settings {
                    internal_registry: registry,
                    ..Settings::from(&cfg)
                };
                for features in features {
                    let shared = Shared::new(&cfg, &settings, features).expect("shared");
                    for ns in ["clusters-a", "clusters-b-2", "ns\"quoted\\", "ünïcode"] {
                        let alone = render_alone(&cfg, &settings, ns, features).expect("alone");
                        let from_shared = shared.for_namespace(ns).expect("shared");
                        assert_eq!(from_shared, alone, "{ns} under {features:?}");
                        checked += usize::from(alone.revision.is_some());
                    }
                }
            }
        }
        assert!(checked > 0, "no set with a revision was compared");
    }

    /// The rendering kept is the one for the configuration asked about: a change to it, to
    /// the settings or to what the server serves gives another.
    #[test]
    fn a_kept_rendering_is_only_used_for_its_own_inputs() {
        let kept = Kept::default();
        let cfg = AgentConfig::default();
        let settings = Settings::from(&cfg);
        let a = kept.get(&cfg, &settings, served()).expect("a");
        let again = kept.get(&cfg, &settings, served()).expect("again");
        assert!(Arc::ptr_eq(&a, &again));
        let mut warn = cfg.clone();
        warn.webhooks[0].mode = Mode::Warn;
        let b = kept
            .get(&warn, &Settings::from(&warn), served())
            .expect("b");
        assert!(!Arc::ptr_eq(&a, &b));
        let c = kept
            .get(&cfg, &settings, HostedFeatures::default())
            .expect("c");
        assert!(!Arc::ptr_eq(&a, &c));
        let registry = Settings {
            internal_registry: Some(Default::default()),
            ..settings.clone()
        };
        let d = kept.get(&cfg, &registry, served()).expect("d");
        assert!(!Arc::ptr_eq(&a, &d));
        // Past `KEPT` renderings the one used longest ago goes; the one used just now stays.
        for i in 0..KEPT {
            let mut other = cfg.clone();
            other.webhooks[0].name = format!("other-{i}.example.com");
            kept.get(&other, &Settings::from(&other), served())
                .expect("other");
            kept.get(&cfg, &settings, served()).expect("a again");
        }
        assert!(Arc::ptr_eq(
            &a,
            &kept.get(&cfg, &settings, served()).expect("a")
        ));
        assert!(!Arc::ptr_eq(
            &b,
            &kept
                .get(&warn, &Settings::from(&warn), served())
                .expect("b")
        ));
        let alone = render_alone(&warn, &Settings::from(&warn), "ns", served()).expect("alone");
        assert_eq!(b.for_namespace("ns").expect("b"), alone);
    }

    /// A configuration with a string that is the stand-in is rendered HCP by HCP; one that
    /// only holds it in a longer string is shared, and rendered right.
    #[test]
    fn a_text_holding_the_stand_in_is_not_shared() {
        let named = |name: &str| {
            let mut cfg = AgentConfig::default();
            let Some(w) = cfg
                .webhooks
                .iter_mut()
                .find(|w| w.name.starts_with("protected-rbac"))
            else {
                panic!("the default configuration has the protected RBAC guard");
            };
            w.name = name.to_string();
            cfg
        };
        let cfg = named(SLOT);
        let settings = Settings::from(&cfg);
        assert!(Shared::new(&cfg, &settings, served()).is_none());
        let rendered = policies::render(&cfg, &settings, "ns", served()).expect("render");
        let alone = render_alone(&cfg, &settings, "ns", served()).expect("alone");
        assert_eq!(rendered, alone);

        let cfg = named(&format!("{SLOT}.example.com"));
        let settings = Settings::from(&cfg);
        let shared = Shared::new(&cfg, &settings, served()).expect("shared");
        let alone = render_alone(&cfg, &settings, "ns", served()).expect("alone");
        assert_eq!(shared.for_namespace("ns").expect("shared"), alone);
    }

    #[test]
    fn the_stand_in_is_cut_where_serde_json_writes_it() {
        assert_eq!(serde_json::to_string(SLOT).expect("json"), SLOT_JSON);
    }
}
