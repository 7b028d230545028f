//! Every mutation with a CEL form, through both engines on its guard's table of cases: the
//! admission service's JSON patch (`hcp_fleet_webhook::decision::decide`) and the rendered
//! MutatingAdmissionPolicy (its matchConditions, then its apply configuration merged into the
//! object), evaluated by cel-rust. Both must leave the object alike, and change it exactly where
//! the table says the guard acts.
//!
//! cel-rust has no typed object construction (`Object{…}`, `Object.metadata{…}`), which the API
//! server evaluates against the resource's schema: `as_maps` writes each such construction as
//! the map literal with the same fields, and `merged` merges the result into the object as
//! server-side apply merges an apply configuration (maps key by key, lists of named objects by
//! name). Everything else is the expression the API server runs, unchanged.

use std::sync::Arc;

use ::cel::Env;
use serde_json::{Map, Value};

use super::admission_policies::{self, AdmissionPolicies};
use super::cel_cases::{env, eval, served};
use crate::config::AgentConfig;
use hcp_fleet_guards as guards;
use hcp_fleet_guards::review::decode;
use hcp_fleet_guards::{Case, Guard, Settings, Want};
use hcp_fleet_webhook::decision::decide;

/// `expr` with every typed object construction (`Object{f: v}`, `Object.a.b{f: v}`) written as
/// a map literal (`{'f': v}`); string literals are left as they are.
pub(super) fn as_maps(expr: &str) -> String {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = String::with_capacity(expr.len());
    // For each open brace: is it a typed construction (its field names get quoted)?
    let mut braces: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' || c == '"' {
            let end = string_end(&chars, i);
            out.extend(&chars[i..end]);
            i = end;
            continue;
        }
        let starts_ident = c.is_ascii_alphabetic() || c == '_';
        let after_ident = i > 0 && (chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_');
        if starts_ident && !after_ident {
            let mut j = i;
            while j < chars.len()
                && (chars[j].is_ascii_alphanumeric() || chars[j] == '_' || chars[j] == '.')
            {
                j += 1;
            }
            let word: String = chars[i..j].iter().collect();
            if (word == "Object" || word.starts_with("Object.")) && chars.get(j) == Some(&'{') {
                out.push('{');
                braces.push(true);
                i = j + 1;
                continue;
            }
            // A field name of a typed construction: `name:` right after `{` or `,`.
            let in_typed = braces.last() == Some(&true);
            let prev = out.trim_end().chars().last();
            let next = chars[j..].iter().find(|c| !c.is_whitespace());
            if in_typed
                && matches!(prev, Some('{' | ','))
                && next == Some(&':')
                && !word.contains('.')
            {
                out.push('\'');
                out.push_str(&word);
                out.push('\'');
            } else {
                out.push_str(&word);
            }
            i = j;
            continue;
        }
        match c {
            '{' => braces.push(false),
            '}' => {
                braces.pop();
            }
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Where the string literal starting at `start` ends (one past its closing quote).
fn string_end(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// `config` merged into `object` as server-side apply merges an apply configuration: maps
/// key by key, lists of objects with a `name` by name, anything else replaced.
pub(super) fn merged(object: &Value, config: &Value) -> Value {
    match (object, config) {
        (Value::Object(o), Value::Object(c)) => {
            let mut out: Map<String, Value> = o.clone();
            for (k, v) in c {
                let merged_v = match o.get(k) {
                    Some(old) => merged(old, v),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged_v);
            }
            Value::Object(out)
        }
        (Value::Array(o), Value::Array(c)) if c.iter().all(|x| x["name"].is_string()) => {
            let mut out = o.clone();
            for item in c {
                match out.iter_mut().find(|x| x["name"] == item["name"]) {
                    Some(old) => *old = merged(old, item),
                    None => out.push(item.clone()),
                }
            }
            Value::Array(out)
        }
        (Value::Null, c) => c.clone(),
        (_, c) => c.clone(),
    }
}

/// The JSON patch the service answers with applied to `object` (`add` and `replace`, what the
/// mutations write).
fn patched(object: &Value, patch: &[Value]) -> Value {
    let mut out = object.clone();
    for op in patch {
        let path = op["path"].as_str().unwrap_or_default();
        let (parent, key) = path.rsplit_once('/').unwrap_or(("", path));
        let key = key.replace("~1", "/").replace("~0", "~");
        let target = if parent.is_empty() {
            Some(&mut out)
        } else {
            out.pointer_mut(parent)
        };
        match target {
            Some(Value::Object(m)) => {
                m.insert(key, op["value"].clone());
            }
            Some(Value::Array(a)) => match key.parse::<usize>() {
                Ok(i) if i < a.len() => a[i] = op["value"].clone(),
                _ => panic!("{path}: no such element"),
            },
            _ => panic!("{path}: no parent to patch in {object}"),
        }
    }
    out
}

/// The object after the rendered mutating policy of `guard`, or `None` where its
/// matchConditions leave the request alone.
fn by_policy(env: &Arc<Env>, rendered: &AdmissionPolicies, guard: &str, c: &Case) -> Option<Value> {
    let policy = rendered
        .mutating
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(guard))
        .unwrap_or_else(|| panic!("{guard}: no mutating policy"));
    by_spec(env, &policy.data["spec"], guard, c)
}

/// Evaluates `e` to JSON, or fails the test naming the guard.
fn json_of(env: &Arc<Env>, guard: &str, e: &str, vars: &[(&str, &Value)]) -> Value {
    match eval(env, e, vars) {
        Ok(v) => v
            .json()
            .unwrap_or_else(|err| panic!("{guard}: {e}: {err:?}")),
        Err(err) => panic!("{guard}: {err}"),
    }
}

/// `by_policy` on a policy's spec: the matchConditions, then the variables in order (bound as
/// `variables`, as the API server binds them), then each mutation merged in.
fn by_spec(env: &Arc<Env>, spec: &Value, guard: &str, c: &Case) -> Option<Value> {
    let request = c.request();
    let vars: [(&str, &Value); 3] = [
        ("request", &request),
        ("object", &c.object),
        ("oldObject", &c.old),
    ];
    let applies = spec["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|m| {
            match json_of(
                env,
                guard,
                m["expression"].as_str().unwrap_or_default(),
                &vars,
            ) {
                Value::Bool(b) => b,
                other => panic!("{guard}: a matchCondition gave {other}"),
            }
        });
    if !applies {
        return None;
    }
    let mut variables = Map::new();
    for v in spec["variables"].as_array().into_iter().flatten() {
        let bound = Value::Object(variables.clone());
        let with: [(&str, &Value); 4] = [vars[0], vars[1], vars[2], ("variables", &bound)];
        let value = json_of(
            env,
            guard,
            v["expression"].as_str().unwrap_or_default(),
            &with,
        );
        variables.insert(v["name"].as_str().unwrap_or_default().to_string(), value);
    }
    let variables = Value::Object(variables);
    let with: [(&str, &Value); 4] = [vars[0], vars[1], vars[2], ("variables", &variables)];
    let mut object = c.object.clone();
    for m in spec["mutations"].as_array().into_iter().flatten() {
        assert_eq!(m["patchType"], "ApplyConfiguration", "{guard}");
        let e = as_maps(
            m["applyConfiguration"]["expression"]
                .as_str()
                .unwrap_or_default(),
        );
        object = merged(&object, &json_of(env, guard, &e, &with));
    }
    Some(object)
}

/// The default configuration with every mutation in enforce mode (the Service annotation is
/// in warn mode by default).
fn enforcing() -> AgentConfig {
    let mut cfg = AgentConfig::default();
    for w in &mut cfg.webhooks {
        if guards::has_mutation_form(&w.path) {
            w.mode = hcp_fleet_model::Mode::Enforce;
        }
    }
    cfg
}

/// Every mutation with a CEL form, with its table of cases and its canary.
fn cases() -> Vec<(&'static dyn Guard, Case)> {
    let s = Settings::from(&enforcing());
    guards::ALL
        .iter()
        .filter(|g| g.mutation(&s).is_some())
        .flat_map(|g| {
            let canary = g.canary(&s).map(|c| c.case());
            g.cases().into_iter().chain(canary).map(move |c| (*g, c))
        })
        .collect()
}

/// The heart of it: each case through the service's patch and the policy's apply
/// configuration, the object left alike, changed exactly where the table says the guard acts.
#[test]
fn each_mutations_policy_changes_the_object_as_its_handler_case_by_case() {
    let env = env();
    let cfg = enforcing();
    let s = Settings::from(&cfg);
    let rendered = admission_policies::render(&cfg, &s, "clusters-a", served()).expect("render");
    let cases = cases();
    assert!(cases.len() > 10, "{}", cases.len());
    for (g, c) in cases {
        let (guard, what) = (g.row().name, c.what);
        let body = c.review();
        let r = decode(&body).expect("the case decodes");
        let (_, d) = decide(g.row().path, &r, &s).expect("a guard");
        assert!(d.allowed, "{guard}, {what}: a mutation never denies");
        let by_service = (!d.patch.is_empty()).then(|| patched(&c.object, &d.patch));
        let by_cel = by_policy(&env, &rendered, guard, &c);
        // Where the conditions hold, the policy's change may be a no-op (the server then
        // writes nothing): compare the objects that result.
        let result = |o: &Option<Value>| o.clone().unwrap_or_else(|| c.object.clone());
        assert_eq!(
            result(&by_cel),
            result(&by_service),
            "{guard}, {what}: the policy and the service leave the object differently"
        );
        assert_eq!(
            result(&by_service) != c.object,
            c.want == Want::Deny,
            "{guard}, {what}: the table says the guard {} act",
            if c.want == Want::Deny {
                "must"
            } else {
                "must not"
            }
        );
    }
}

/// Each mutation with a CEL form is a mutating policy where served, in enforce mode only.
#[test]
fn mutations_are_policies_where_served_and_in_enforce_mode_only() {
    let cfg = enforcing();
    let s = Settings::from(&cfg);
    let names =
        |r: &AdmissionPolicies| -> Vec<String> { r.mutations().map(String::from).collect() };
    let want: Vec<String> = guards::ALL
        .iter()
        .filter(|g| g.mutation(&s).is_some())
        .map(|g| g.row().name.to_string())
        .collect();
    assert!(want.len() >= 2, "{want:?}");
    let served_set = admission_policies::render(&cfg, &s, "ns", served()).expect("render");
    assert_eq!(names(&served_set), want);
    // Each with its binding, the probe's last.
    assert_eq!(served_set.mutating.len(), want.len() + 1);
    assert_eq!(served_set.mutating_bindings.len(), want.len() + 1);
    let last = |v: &[kube::core::DynamicObject]| v.last().and_then(|o| o.metadata.name.clone());
    let probe = Some(admission_policies::probe_name().to_string());
    assert_eq!(last(&served_set.mutating), probe);
    assert_eq!(last(&served_set.mutating_bindings), probe);
    assert!(served_set.mutating_revision.is_some());
    let not_served = super::objects::HostedFeatures {
        mutating_policies: false,
        ..served()
    };
    let none = admission_policies::render(&cfg, &s, "ns", not_served).expect("render");
    assert!(none.mutating.is_empty() && none.mutating_bindings.is_empty());
    assert!(none.mutating_revision.is_none());
    let mut warn = AgentConfig::default();
    for w in &mut warn.webhooks {
        w.mode = hcp_fleet_model::Mode::Warn;
    }
    let warned =
        admission_policies::render(&warn, &Settings::from(&warn), "ns", served()).expect("render");
    assert!(warned.mutating.is_empty(), "a mutating policy cannot warn");
    // In warn mode each is a validating policy instead, bound to warn and audit.
    let validating: Vec<&str> = warned.guards().collect();
    for name in &want {
        assert!(
            validating.contains(&name.as_str()),
            "{name}: {validating:?}"
        );
        let binding = warned
            .bindings
            .iter()
            .find(|b| b.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|b| b.spec.clone())
            .and_then(|s| s.validation_actions)
            .expect("its binding's actions");
        assert_eq!(binding, ["Warn", "Audit"], "{name}");
    }
}

/// A mutation in warn mode, as its validating policy: on every case of its table the policy
/// warns exactly where the service warns that it would have mutated, in the same words, and
/// lets every request through, as the service does.
#[test]
fn a_mutation_in_warn_mode_warns_through_its_policy_as_through_the_service() {
    use super::cel_cases::{Outcome, by_policy as validated, by_rust};
    use hcp_fleet_model::Mode;
    let env = env();
    let mut cfg = enforcing();
    for w in &mut cfg.webhooks {
        if guards::has_mutation_form(&w.path) {
            w.mode = Mode::Warn;
        }
    }
    let s = Settings::from(&cfg);
    let rendered = admission_policies::render(&cfg, &s, "clusters-a", served()).expect("render");
    let (mut warned, mut checked) = (0, 0);
    for (g, c) in cases() {
        let by_service = by_rust(g, &c, &s, Mode::Warn);
        let by_cel = validated(&env, &rendered, g.row().name, &c);
        assert_eq!(by_cel, by_service, "{}, {}", g.row().name, c.what);
        assert!(
            by_cel.allowed,
            "{}, {}: warn mode lets it through",
            g.row().name,
            c.what
        );
        warned += usize::from(by_cel != Outcome::silent());
        checked += 1;
    }
    assert!(
        warned > 5 && warned < checked,
        "{warned} of {checked} warned"
    );
}

#[test]
fn typed_constructions_become_map_literals_and_strings_stay() {
    assert_eq!(
        as_maps("Object{metadata: Object.metadata{annotations: {'a:b': x.y}}}"),
        "{'metadata': {'annotations': {'a:b': x.y}}}"
    );
    assert_eq!(
        as_maps(
            "Object{spec: Object.spec{containers: l.map(c, Object.spec.containers{name: c.name, image: 'Object{x: 1}'})}}"
        ),
        "{'spec': {'containers': l.map(c, {'name': c.name, 'image': 'Object{x: 1}'})}}"
    );
    assert_eq!(as_maps("a ? {'k': b} : {}"), "a ? {'k': b} : {}");
}

#[test]
fn the_merge_is_by_key_and_by_name() {
    let o = serde_json::json!({"metadata": {"annotations": {"a": "1"}}, "spec": {"containers": [{"name": "x", "image": "i"}, {"name": "y", "image": "j"}]}});
    let c = serde_json::json!({"metadata": {"annotations": {"b": "2"}}, "spec": {"containers": [{"name": "y", "image": "k"}]}});
    assert_eq!(
        merged(&o, &c),
        serde_json::json!({"metadata": {"annotations": {"a": "1", "b": "2"}}, "spec": {"containers": [{"name": "x", "image": "i"}, {"name": "y", "image": "k"}]}})
    );
}

/// The mutating probe writes its revision into a ConfigMap that carries it, and its
/// matchConstraints select only such ConfigMaps.
#[test]
fn the_mutating_probe_writes_its_revision() {
    let env = env();
    let cfg = AgentConfig::default();
    let rendered =
        admission_policies::render(&cfg, &Settings::from(&cfg), "ns", served()).expect("render");
    let revision = rendered.mutating_revision.clone().expect("a revision");
    let probe = rendered.mutating.last().expect("the probe");
    let spec = &probe.data["spec"];
    let selector = &spec["matchConstraints"]["objectSelector"]["matchLabels"];
    assert_eq!(
        selector[guards::catalogue::PROBE_LABEL],
        guards::catalogue::MUTATING_PROBE_VALUE
    );
    assert_eq!(
        selector[guards::catalogue::PROBE_REVISION_LABEL],
        revision.as_str()
    );
    let e = as_maps(
        spec["mutations"][0]["applyConfiguration"]["expression"]
            .as_str()
            .expect("e"),
    );
    let config = eval(&env, &e, &[])
        .expect("evaluates")
        .json()
        .expect("json");
    assert_eq!(
        config["metadata"]["annotations"][guards::catalogue::MUTATING_PROBE_ANSWER],
        revision.as_str()
    );
}

/// The pod image spec mutation's CEL form, under the registry its cases are decided under
/// (removed, `cli` and `must-gather` known), on every case of its table and its canary: the
/// policy rewrites what the service's patch rewrites.
#[test]
fn the_pod_image_spec_policy_rewrites_as_its_handler_case_by_case() {
    use hcp_fleet_guards::pod_image_spec::{self, ROW, case_registry};
    let env = env();
    let cfg = AgentConfig::default();
    let s = Settings {
        internal_registry: Some(case_registry()),
        ..Settings::from(&cfg)
    };
    let w = cfg
        .webhooks
        .iter()
        .find(|w| w.path == ROW.path)
        .expect("the guard's definition");
    let (policy, _) = admission_policies::guard_mutation(w, &w.name, &s, "ns").expect("a CEL form");
    let g = guards::for_path(ROW.path).expect("guard");
    let cases: Vec<Case> = g
        .cases()
        .into_iter()
        .chain(g.canary(&s).map(|c| c.case()))
        .collect();
    assert!(cases.len() > 15, "{}", cases.len());
    for c in cases {
        let body = c.review();
        let r = decode(&body).expect("decodes");
        let (_, d) = decide(ROW.path, &r, &s).expect("a guard");
        let by_service = if d.patch.is_empty() {
            c.object.clone()
        } else {
            patched(&c.object, &d.patch)
        };
        let by_cel =
            by_spec(&env, &policy["spec"], ROW.name, &c).unwrap_or_else(|| c.object.clone());
        assert_eq!(
            by_cel, by_service,
            "{}: the policy and the service differ",
            c.what
        );
        assert_eq!(by_service != c.object, c.want == Want::Deny, "{}", c.what);
    }
    // Managed, or nothing known: no form (the webhook keeps the guard).
    let managed = Settings {
        internal_registry: Some(pod_image_spec::InternalRegistry {
            management_state: Some(pod_image_spec::MANAGED.into()),
            ..case_registry()
        }),
        ..Settings::from(&cfg)
    };
    assert!(g.mutation(&managed).is_none());
    assert!(g.mutation(&Settings::from(&cfg)).is_none());
    assert!(guards::has_mutation_form(ROW.path));
}

/// The hosted rendering gives the pod image spec mutation to a MutatingAdmissionPolicy where
/// the server serves them, carrying the registry the agent read: rendered with the table where
/// the registry rewrites, not at all where it has nothing to rewrite (Managed, or nothing
/// read), and never as a webhook then; on a server without mutating policies the webhook,
/// whatever the registry.
#[test]
fn the_hosted_rendering_gives_the_pod_image_spec_to_a_policy_with_the_registry_read() {
    use crate::hosted::objects::HostedFeatures;
    use crate::hosted::webhooks;
    use hcp_fleet_guards::pod_image_spec::{self, ROW, case_registry};
    let cfg = AgentConfig::default();
    let served = served();
    let render = |features, reg: Option<&pod_image_spec::InternalRegistry>| {
        webhooks::render(&cfg, "ns", "https://x", "CA", features, reg).expect("render")
    };
    let hooked = |h: &webhooks::HostedWebhooks| {
        h.mutating
            .iter()
            .flat_map(|m| m.webhooks.iter().flatten())
            .any(|w| w.name == ROW.name)
    };
    let policy = |h: &webhooks::HostedWebhooks| {
        h.policies
            .mutating
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(ROW.name))
            .map(|p| p.data["spec"].to_string())
    };
    let removed = case_registry();
    let with_table = render(served, Some(&removed));
    let carried = policy(&with_table).expect("a policy where the registry rewrites");
    assert!(carried.contains(pod_image_spec::CASE_CLI), "{carried}");
    assert!(!hooked(&with_table));
    let managed = pod_image_spec::InternalRegistry {
        management_state: Some(pod_image_spec::MANAGED.into()),
        ..case_registry()
    };
    for reg in [Some(&managed), None] {
        let h = render(served, reg);
        assert!(policy(&h).is_none() && !hooked(&h), "{reg:?}");
    }
    // The table changes: so does the policy, and with it the mutating probe's revision.
    let mut fewer = case_registry();
    fewer.tags.retain(|k, _| k.starts_with("cli"));
    let changed = render(served, Some(&fewer));
    assert_ne!(policy(&changed), Some(carried));
    assert_ne!(
        changed.policies.mutating_revision,
        with_table.policies.mutating_revision
    );
    let old = HostedFeatures {
        mutating_policies: false,
        ..served
    };
    for reg in [Some(&removed), None] {
        let h = render(old, reg);
        assert!(policy(&h).is_none() && hooked(&h), "{reg:?}");
    }
}
