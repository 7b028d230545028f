//! What the drift watch of one hosted cluster compares live objects with, kept small: per
//! object only the parts the comparison reads (its labels and annotations, and the part the
//! agent renders whole: a configuration's `webhooks`, a policy's or binding's `spec`). Those
//! parts are interned, so every HCP that renders a part alike (a policy's CEL, the exemptions)
//! holds one shared copy: the whole rendering, kept per HCP, was most of the agent's memory per
//! hosted cluster at a thousand (`make bench`, the scale benchmark). Each part is held as its
//! JSON text, read back only when a watch event is compared: what is the HCP's own (its claim,
//! its probe's webhook, its address and CA) held as `Value` trees was still about 15 KiB per
//! HCP, several times its text.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use kube::core::DynamicObject;
use serde::Serialize;
use serde_json::Value;

use super::webhooks::HostedWebhooks;

/// One object the agent wants in the hosted cluster.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WantedObject {
    pub(crate) kind: &'static str,
    /// Interned: every HCP's guards have the same names, and the drift watch holds them too.
    pub(crate) name: Part,
    /// `{"labels": …, "annotations": …}` as rendered (interned too: every object of an HCP
    /// carries the same claim, and every HCP the same labels).
    metadata: Part,
    /// `webhooks` or `spec`.
    whole: &'static str,
    body: Body,
}

/// The part rendered whole, interned: a policy's or binding's `spec` in one piece; a
/// configuration's `webhooks` entry by entry, each without its `clientConfig` (the same in
/// every HCP), the `clientConfig` without its `caBundle` (the HCP's address), and the
/// `caBundle` (the HCP's CA, the same for each of its webhooks). Interned whole, the webhooks
/// were a copy per HCP, the CA once per guard: about 26 KiB per HCP at a thousand (`make
/// bench`, heaptrack).
#[derive(Debug, Clone, PartialEq)]
enum Body {
    Whole(Part),
    Webhooks(Vec<WebhookParts>),
}

#[derive(Debug, Clone, PartialEq)]
struct WebhookParts {
    rest: Part,
    client_config: Option<Part>,
    ca_bundle: Option<Part>,
}

/// One interned part: its compact JSON text.
pub(crate) type Part = Arc<str>;

/// A part as JSON again. It was written by serde_json from a `Value`, so it reads back; were
/// it not to, `null` compares unequal to anything live and the object is repaired.
fn value(part: &Part) -> Value {
    serde_json::from_str(part).unwrap_or(Value::Null)
}

impl Body {
    /// A configuration's `webhooks`, held entry by entry (each entry's fields apart, so through
    /// a `Value`: two configurations per HCP).
    fn webhooks(body: Value) -> Self {
        match body {
            Value::Array(hooks) => {
                Body::Webhooks(hooks.into_iter().map(WebhookParts::of).collect())
            }
            body => Body::Whole(intern(body)),
        }
    }

    fn to_value(&self) -> Value {
        match self {
            Body::Whole(v) => value(v),
            Body::Webhooks(hooks) => {
                Value::Array(hooks.iter().map(WebhookParts::to_value).collect())
            }
        }
    }
}

impl WebhookParts {
    fn of(mut hook: Value) -> Self {
        let mut client_config = hook.as_object_mut().and_then(|h| h.remove("clientConfig"));
        let ca_bundle = client_config
            .as_mut()
            .and_then(Value::as_object_mut)
            .and_then(|c| c.remove("caBundle"));
        WebhookParts {
            rest: intern(hook),
            client_config: client_config.map(intern),
            ca_bundle: ca_bundle.map(intern),
        }
    }

    fn to_value(&self) -> Value {
        let mut hook = value(&self.rest);
        if let Some(c) = &self.client_config {
            let mut c = value(c);
            if let (Some(ca), Some(m)) = (&self.ca_bundle, c.as_object_mut()) {
                m.insert("caBundle".into(), value(ca));
            }
            if let Some(h) = hook.as_object_mut() {
                h.insert("clientConfig".into(), c);
            }
        }
        hook
    }
}

/// Everything the agent wants in one hosted cluster, and the revisions its probe selects.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Wanted {
    objects: Vec<WantedObject>,
    pub webhook_revision: Option<String>,
    pub policy_revision: Option<String>,
}

impl Wanted {
    pub fn of(d: &HostedWebhooks) -> Self {
        let mut objects = Vec::new();
        let mut add = |kind: &'static str, o: &dyn ErasedObject| {
            if let Some(w) = o.wanted(kind) {
                objects.push(w);
            }
        };
        if let Some(v) = &d.validating {
            add("ValidatingWebhookConfiguration", v);
        }
        if let Some(m) = &d.mutating {
            add("MutatingWebhookConfiguration", m);
        }
        for p in &d.policies.policies {
            add("ValidatingAdmissionPolicy", p);
        }
        for b in &d.policies.bindings {
            add("ValidatingAdmissionPolicyBinding", b);
        }
        for p in &d.policies.mutating {
            add("MutatingAdmissionPolicy", p);
        }
        for b in &d.policies.mutating_bindings {
            add("MutatingAdmissionPolicyBinding", b);
        }
        Wanted {
            objects,
            webhook_revision: d.webhook_revision.clone(),
            policy_revision: d.policies.revision.clone(),
        }
    }

    /// Every wanted object's kind and name: what the drift watch reads, one watch by name
    /// each.
    pub fn watched(&self) -> Vec<(&'static str, Part)> {
        self.objects
            .iter()
            .map(|o| (o.kind, Arc::clone(&o.name)))
            .collect()
    }

    /// Do both want the same objects (kinds and names, in order), whatever their content? The
    /// drift watch asks at every reconcile, without building `watched` twice.
    pub fn same_objects(&self, other: &Wanted) -> bool {
        self.objects
            .iter()
            .map(|o| (o.kind, &*o.name))
            .eq(other.objects.iter().map(|o| (o.kind, &*o.name)))
    }

    /// The names of the wanted objects of `kind`.
    pub fn names(&self, kind: &str) -> Vec<String> {
        self.objects
            .iter()
            .filter(|o| o.kind == kind)
            .map(|o| o.name.to_string())
            .collect()
    }

    /// The wanted object of `kind` named `name`, as JSON holding what the comparison reads
    /// (`None`: not wanted).
    pub fn object(&self, kind: &str, name: &str) -> Option<Value> {
        let o = self
            .objects
            .iter()
            .find(|o| o.kind == kind && *o.name == *name)?;
        let mut v = serde_json::json!({ "metadata": value(&o.metadata) });
        v[o.whole] = o.body.to_value();
        Some(v)
    }
}

/// `Wanted::of`'s view of one rendered object: its metadata, and the part it renders whole.
/// Each kind says where that part is, so only it is written out: the whole object as a
/// `Value` tree, then its part as text, was a twentieth of a restarted agent's CPU at 3,000
/// HCPs (`make bench`, the scale benchmark, perf), for thirty-odd objects per HCP.
trait ErasedObject {
    fn wanted(&self, kind: &'static str) -> Option<WantedObject>;
}

/// The part an object renders whole: its field (`webhooks`, `spec`) and what it holds. The
/// only thing a kind says for itself; its metadata is `kube::Resource`'s.
trait Whole {
    fn whole(&self) -> Result<(&'static str, Body), serde_json::Error>;
}

impl<K: kube::Resource + Whole> ErasedObject for K {
    fn wanted(&self, kind: &'static str) -> Option<WantedObject> {
        let meta = self.meta();
        let (whole, body) = self.whole().ok()?;
        let name = meta.name.clone()?;
        let metadata = serde_json::to_string(&KeptMetadata {
            annotations: meta.annotations.as_ref(),
            labels: meta.labels.as_ref(),
        })
        .ok()?;
        Some(WantedObject {
            kind,
            name: intern_text(name),
            metadata: intern_text(metadata),
            whole,
            body,
        })
    }
}

/// The metadata the comparison reads, written as `{"annotations": …, "labels": …}` (either
/// left out where unset).
#[derive(Serialize)]
struct KeptMetadata<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<&'a std::collections::BTreeMap<String, String>>,
}

/// A `spec` written straight from its typed value: the same JSON a `Value` of it would write,
/// without the tree (`null` where it is unset, as a missing field reads).
fn spec<T: Serialize>(part: Option<&T>) -> Result<(&'static str, Body), serde_json::Error> {
    let text = serde_json::to_string(&part)?;
    Ok(("spec", Body::Whole(intern_text(text))))
}

fn webhooks<T: Serialize>(hooks: Option<&T>) -> Result<(&'static str, Body), serde_json::Error> {
    Ok(("webhooks", Body::webhooks(serde_json::to_value(hooks)?)))
}

impl Whole for ValidatingWebhookConfiguration {
    fn whole(&self) -> Result<(&'static str, Body), serde_json::Error> {
        webhooks(self.webhooks.as_ref())
    }
}

impl Whole for MutatingWebhookConfiguration {
    fn whole(&self) -> Result<(&'static str, Body), serde_json::Error> {
        webhooks(self.webhooks.as_ref())
    }
}

impl Whole for ValidatingAdmissionPolicy {
    fn whole(&self) -> Result<(&'static str, Body), serde_json::Error> {
        spec(self.spec.as_ref())
    }
}

impl Whole for ValidatingAdmissionPolicyBinding {
    fn whole(&self) -> Result<(&'static str, Body), serde_json::Error> {
        spec(self.spec.as_ref())
    }
}

/// The mutating policies and bindings (dynamic: see `AdmissionPolicies::mutating`).
impl Whole for DynamicObject {
    fn whole(&self) -> Result<(&'static str, Body), serde_json::Error> {
        spec(self.data.get("spec"))
    }
}

/// Every part interned and still held somewhere, by a hash of its JSON.
static POOL: LazyLock<Mutex<Pool>> = LazyLock::new(Default::default);

#[derive(Default)]
struct Pool {
    parts: HashMap<u64, Weak<str>>,
    /// Inserts since the dead entries were last swept.
    since_sweep: usize,
}

/// One shared copy of `v`'s text: the one already held elsewhere if it is equal, else new.
fn intern(v: Value) -> Part {
    intern_text(v.to_string())
}

/// One shared copy of `text`: the one already held elsewhere if it is equal, else new.
pub(crate) fn intern_text(text: String) -> Part {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let key = h.finish();
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(held) = pool.parts.get(&key).and_then(Weak::upgrade)
        && *held == *text
    {
        return held;
    }
    let part: Part = Arc::from(text);
    pool.parts.insert(key, Arc::downgrade(&part));
    pool.since_sweep += 1;
    // Parts no HCP holds any more (a configuration changed, HCPs went) are swept now and then,
    // so the pool stays the size of what is held.
    if pool.since_sweep > 1024 {
        pool.parts.retain(|_, w| w.strong_count() > 0);
        pool.since_sweep = 0;
    }
    part
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;
    use crate::hosted::objects::HostedFeatures;
    use crate::hosted::webhooks::render;
    use kube::core::ObjectMeta;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn rendered(ns: &str) -> HostedWebhooks {
        rendered_with(ns, true)
    }

    /// Without admission policies served, every guard is a webhook; with them, all but the
    /// first.
    fn rendered_with(ns: &str, admission_policies: bool) -> HostedWebhooks {
        let features = HostedFeatures {
            match_conditions: true,
            admission_policies,
            mutating_policies: admission_policies,
            static_guards: false,
            static_mutating: false,
            static_offered: false,
        };
        let url = format!("https://hcp-fleet-admission.{ns}.svc:443");
        // One guard kept on its webhook, so both kinds are rendered where policies are served.
        let mut cfg = AgentConfig::default();
        if let Some(w) = cfg.webhooks.first_mut() {
            w.engine = hcp_fleet_guards::catalogue::GuardEngine::Webhook;
        }
        render(&cfg, ns, &url, CA, features, None)
            .expect("render")
            .claimed(&format!("mgmt/{ns}"))
    }

    /// What the drift watch's restart turns on: the same objects (another HCP's rendering has
    /// other content, the same names), or not (guards moved to webhooks).
    #[test]
    fn the_same_objects_are_the_same_kinds_and_names() {
        let a = Wanted::of(&rendered("clusters-a"));
        let b = Wanted::of(&rendered("clusters-b"));
        let hooks = Wanted::of(&rendered_with("clusters-a", false));
        assert_ne!(a, b);
        assert!(a.same_objects(&b));
        assert_eq!(a.same_objects(&b), a.watched() == b.watched());
        assert!(!a.same_objects(&hooks));
        assert_eq!(a.same_objects(&hooks), a.watched() == hooks.watched());
    }

    #[test]
    fn each_object_keeps_what_the_comparison_reads() {
        let d = rendered("clusters-a");
        let w = Wanted::of(&d);
        let vwc = d.validating.as_ref().expect("validating");
        let name = vwc.metadata.name.clone().expect("name");
        let got = w
            .object("ValidatingWebhookConfiguration", &name)
            .expect("wanted");
        let full = serde_json::to_value(vwc).expect("json");
        assert_eq!(got["webhooks"], full["webhooks"]);
        assert_eq!(got["metadata"]["labels"], full["metadata"]["labels"]);
        assert_eq!(
            got["metadata"]["annotations"],
            full["metadata"]["annotations"]
        );
        // The comparisons give the same answer on the whole rendering and the kept parts.
        assert!(crate::hosted::objects::matches(&got, &full));
        let p = &d.policies.policies[0];
        let pname = p.metadata.name.clone().expect("name");
        let pw = w
            .object("ValidatingAdmissionPolicy", &pname)
            .expect("policy");
        let pfull = serde_json::to_value(p).expect("json");
        assert!(crate::hosted::objects::matches(&pw, &pfull));
        assert_eq!(
            w.names("ValidatingAdmissionPolicy").len(),
            d.policies.policies.len()
        );
        assert!(w.object("ValidatingAdmissionPolicy", "not-ours").is_none());
        assert_eq!(w.policy_revision, d.policies.revision);
    }

    /// The parts as the whole object's `Value` holds them: what `Wanted::of` kept before it
    /// wrote each part straight from its typed value.
    fn through_a_value<K: Serialize>(o: &K, whole: &str) -> (Value, Value) {
        let mut v = serde_json::to_value(o).expect("json");
        let body = v.get_mut(whole).map(Value::take).unwrap_or(Value::Null);
        let mut metadata = serde_json::Map::new();
        for field in ["labels", "annotations"] {
            if let Some(f) = v["metadata"].get(field).filter(|f| !f.is_null()) {
                metadata.insert(field.into(), f.clone());
            }
        }
        (Value::Object(metadata), body)
    }

    /// One object's kind, the part it renders whole, its name, and its parts through a `Value`.
    fn case<K: kube::Resource + Serialize>(
        kind: &'static str,
        whole: &'static str,
        o: &K,
    ) -> (&'static str, &'static str, String, (Value, Value)) {
        let name = o.meta().name.clone().expect("name");
        (kind, whole, name, through_a_value(o, whole))
    }

    /// Every kind's parts, written straight, read back as what the whole object's `Value`
    /// holds; its metadata byte for byte, so HCPs share those copies as before.
    #[test]
    fn parts_written_straight_are_what_the_whole_object_holds() {
        let mut seen = std::collections::BTreeSet::new();
        for d in [rendered("clusters-a"), rendered_with("clusters-b", false)] {
            let w = Wanted::of(&d);
            let p = &d.policies;
            let cases: Vec<_> = d
                .validating
                .iter()
                .map(|o| case("ValidatingWebhookConfiguration", "webhooks", o))
                .chain(
                    d.mutating
                        .iter()
                        .map(|o| case("MutatingWebhookConfiguration", "webhooks", o)),
                )
                .chain(
                    p.policies
                        .iter()
                        .map(|o| case("ValidatingAdmissionPolicy", "spec", o)),
                )
                .chain(
                    p.bindings
                        .iter()
                        .map(|o| case("ValidatingAdmissionPolicyBinding", "spec", o)),
                )
                .chain(
                    p.mutating
                        .iter()
                        .map(|o| case("MutatingAdmissionPolicy", "spec", o)),
                )
                .chain(
                    p.mutating_bindings
                        .iter()
                        .map(|o| case("MutatingAdmissionPolicyBinding", "spec", o)),
                )
                .collect();
            for (kind, whole, name, (metadata, body)) in cases {
                let kept = w
                    .objects
                    .iter()
                    .find(|x| x.kind == kind && *x.name == *name);
                let kept = kept.expect("kept");
                assert_eq!(*kept.metadata, metadata.to_string(), "{kind} {name}");
                assert_eq!(kept.body.to_value(), body, "{kind} {name}");
                assert_eq!(kept.whole, whole);
                seen.insert(kind);
            }
        }
        // Every kind was rendered and checked.
        assert_eq!(seen.len(), 6, "{seen:?}");
        // An unset part reads as `null`, as a missing field does.
        let bare = ValidatingAdmissionPolicy {
            metadata: ObjectMeta {
                name: Some("bare".into()),
                ..ObjectMeta::default()
            },
            ..ValidatingAdmissionPolicy::default()
        };
        let kept = bare.wanted("ValidatingAdmissionPolicy").expect("kept");
        assert_eq!(kept.body.to_value(), Value::Null);
        assert_eq!(&*kept.metadata, "{}");
    }

    #[test]
    fn hcps_that_render_a_part_alike_share_one_copy() {
        let (a, b) = (
            Wanted::of(&rendered("clusters-a")),
            Wanted::of(&rendered("clusters-b")),
        );
        let body = |w: &Wanted, kind: &str| {
            w.objects
                .iter()
                .find(|o| o.kind == kind)
                .map(|o| o.body.clone())
                .expect("an object of the kind")
        };
        let (Body::Whole(pa), Body::Whole(pb)) = (
            body(&a, "ValidatingAdmissionPolicy"),
            body(&b, "ValidatingAdmissionPolicy"),
        ) else {
            panic!("a policy's spec is one part");
        };
        assert!(Arc::ptr_eq(&pa, &pb), "the CEL is held once");
        // A webhook's rules and selectors are held once for every HCP, its CA once per HCP;
        // its address is the HCP's own.
        let vwc = "ValidatingWebhookConfiguration";
        let (a, b) = (
            Wanted::of(&rendered_with("clusters-a", false)),
            Wanted::of(&rendered_with("clusters-b", false)),
        );
        let (Body::Webhooks(ha), Body::Webhooks(hb)) = (body(&a, vwc), body(&b, vwc)) else {
            panic!("a configuration's webhooks are held entry by entry");
        };
        assert!(ha.len() > 1 && ha.len() == hb.len());
        for (x, y) in ha.iter().zip(&hb) {
            // The probe's webhook selects the HCP's own probe revision; every guard's is alike.
            let probe = value(&x.rest)["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("probe."));
            assert_eq!(Arc::ptr_eq(&x.rest, &y.rest), !probe, "{}", x.rest);
            assert_ne!(x.client_config, y.client_config, "each HCP's address");
        }
        let ca = |h: &WebhookParts| h.ca_bundle.clone().expect("a caBundle");
        assert!(
            ha.iter().all(|h| Arc::ptr_eq(&ca(h), &ca(&ha[0]))),
            "the CA once per HCP"
        );
        // Rebuilt, each entry is the rendering's.
        let whole = rendered_with("clusters-a", false);
        let name = whole
            .validating
            .as_ref()
            .and_then(|v| v.metadata.name.clone())
            .expect("name");
        let full = serde_json::to_value(whole.validating.as_ref().expect("vwc")).expect("json");
        assert_eq!(
            a.object(vwc, &name).expect("wanted")["webhooks"],
            full["webhooks"]
        );
        // What differs per HCP (the claim) stays its own.
        assert_ne!(a, b);
    }
}
