//! Every CEL expression the project ships, parsed and evaluated by a CEL interpreter (the `cel`
//! crate, cel-rust) on the same table of cases as the Rust decision beside it, so the two
//! engines cannot disagree unseen where no 1.30+ kube-apiserver is at hand (the test bed runs
//! Debian's 1.20; docs/testbed.md).
//!
//! - Each guard with a CEL form: its ValidatingAdmissionPolicy as rendered (matchConditions,
//!   the validation's expression, its messageExpression, the binding's validationActions)
//!   against the admission service's decision (`hcp_fleet_webhook::decision::decide`) for the same
//!   request, in enforce and in warn mode: same verdict, same text.
//! - The exemptions as webhook `matchConditions`: a request they leave out is one the service
//!   exempts.
//! - The override CRD's `x-kubernetes-validations`: whatever a rule refuses, the agent's own
//!   check (`overrides::resolve`) refuses too.
//!
//! What the API server evaluates outside CEL (resourceRules, namespace and object selectors) is
//! the same object in both engines (`objects::rules_json`, the guarded selectors), so it is
//! not part of the comparison.
//!
//! Kubernetes' CEL environment is cel-go's standard library plus its extensions. The
//! expressions here use the standard library, `dyn`, `has`, `all`, `exists`, `exists_one`,
//! `in`, `startsWith` and the strings extension's `lowerAscii`, `split`, `trim` and `join`:
//! cel-rust has each of them (the strings extension's through `extensions::strings`, registered below as Kubernetes registers
//! cel-go's `ext.Strings`). Kubernetes' own libraries (`authorizer`, `quantity`, `url`, `ip`,
//! `cidr`, `format`) are not in the interpreter and not used by any expression the project
//! ships; `every_shipped_expression_uses_only_covered_functions` keeps it so. The standard
//! `matches` is RE2 in cel-go and Rust's `regex` in cel-rust: the one pattern shipped (the pod
//! image spec mutation's) uses anchors, literals and explicit character classes only, where
//! the two agree (`\s` would not: Rust's is Unicode's).

use std::collections::BTreeSet;
use std::sync::Arc;

use ::cel::{Context, Env, Program, Value as Cel};
use serde_json::{Value, json};

use super::admission_policies::{self, AdmissionPolicies};
use super::objects::HostedFeatures;
use super::webhooks::{self};
use crate::config::AgentConfig;
use hcp_fleet_guards as guards;
use hcp_fleet_guards::Settings;
use hcp_fleet_guards::review::decode;
use hcp_fleet_guards::{Case, Guard, Want};
use hcp_fleet_model::Mode;
use hcp_fleet_webhook::decision::decide;

/// The functions and macros the expressions may call: what both cel-go (with Kubernetes'
/// extensions) and cel-rust provide.
const COVERED: &[&str] = &[
    "dyn",
    "has",
    "all",
    "exists",
    "exists_one",
    "startsWith",
    "lowerAscii",
    "size",
    "filter",
    "map",
    "split",
    "trim",
    "join",
    "substring",
    "matches",
];

pub(super) fn env() -> Arc<Env> {
    let mut env = Env::stdlib();
    env.add_extension(::cel::extensions::strings)
        .expect("the strings extension registers");
    Arc::new(env)
}

/// Evaluates `expr` with `vars` (JSON) bound, as the API server binds them.
pub(super) fn eval(env: &Arc<Env>, expr: &str, vars: &[(&str, &Value)]) -> Result<Cel, String> {
    let program = env
        .compile(expr)
        .map_err(|e| format!("{expr}: does not parse: {e:?}"))?;
    let mut ctx = Context::with_env(env.clone());
    for (name, v) in vars {
        let v = ::cel::to_value(v).map_err(|e| format!("{name}: {e}"))?;
        ctx.add_variable_from_value(*name, v);
    }
    program
        .execute(&ctx)
        .map_err(|e| format!("{expr}: fails: {e:?}"))
}

fn eval_bool(env: &Arc<Env>, expr: &str, vars: &[(&str, &Value)]) -> bool {
    match eval(env, expr, vars) {
        Ok(Cel::Bool(b)) => b,
        other => panic!("{expr}: not a bool: {other:?}"),
    }
}

fn eval_string(env: &Arc<Env>, expr: &str, vars: &[(&str, &Value)]) -> String {
    match eval(env, expr, vars) {
        Ok(Cel::String(s)) => s.to_string(),
        other => panic!("{expr}: not a string: {other:?}"),
    }
}

/// What one engine made of a request: allowed, and the text it said (denial or warning).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Outcome {
    pub(super) allowed: bool,
    pub(super) said: Option<String>,
}

impl Outcome {
    /// Allowed, with nothing said.
    pub(super) fn silent() -> Self {
        Outcome {
            allowed: true,
            said: None,
        }
    }
}

pub(super) fn by_rust(guard: &dyn Guard, req: &Case, s: &Settings, mode: Mode) -> Outcome {
    let body = req.review();
    let r = decode(&body).expect("the case decodes");
    let (_, d) = decide(guard.row().path, &r, s).expect("a guard");
    let said = match mode {
        Mode::Warn => d.warnings.first().cloned(),
        Mode::Enforce | Mode::Off => d.message.clone(),
    };
    Outcome {
        allowed: d.allowed,
        said: if d.allowed && mode == Mode::Enforce {
            None
        } else {
            said
        },
    }
}

/// As the API server evaluates a policy: every matchCondition must hold, else the policy
/// does not apply; a false validation denies (Deny) or warns (Warn) with the message.
pub(super) fn by_policy(
    env: &Arc<Env>,
    rendered: &AdmissionPolicies,
    guard: &str,
    req: &Case,
) -> Outcome {
    let policy = rendered
        .policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(guard))
        .expect("the guard's policy");
    let binding = rendered
        .bindings
        .iter()
        .find(|b| b.metadata.name.as_deref() == Some(guard))
        .expect("the guard's binding");
    let spec = policy.spec.as_ref().expect("spec");
    let request = req.request();
    let vars: [(&str, &Value); 3] = [
        ("request", &request),
        ("object", &req.object),
        ("oldObject", &req.old),
    ];
    let applies = spec
        .match_conditions
        .iter()
        .flatten()
        .all(|c| eval_bool(env, &c.expression, &vars));
    if !applies {
        return Outcome {
            allowed: true,
            said: None,
        };
    }
    let v = &spec.validations.as_ref().expect("validations")[0];
    if eval_bool(env, &v.expression, &vars) {
        return Outcome {
            allowed: true,
            said: None,
        };
    }
    let message = eval_string(
        env,
        v.message_expression.as_deref().expect("messageExpression"),
        &vars,
    );
    let actions = binding
        .spec
        .as_ref()
        .and_then(|s| s.validation_actions.clone())
        .unwrap_or_default();
    Outcome {
        allowed: !actions.iter().any(|a| a == "Deny"),
        said: Some(message),
    }
}

pub(super) fn served() -> HostedFeatures {
    HostedFeatures {
        match_conditions: true,
        admission_policies: true,
        mutating_policies: true,
        static_guards: false,
        static_mutating: false,
        static_offered: false,
    }
}

fn with_mode(mode: Mode) -> AgentConfig {
    let mut cfg = AgentConfig::default();
    for w in &mut cfg.webhooks {
        w.mode = mode;
    }
    cfg
}

/// Every guard with a CEL form and its table of cases, its canary among them (a canary the
/// policy lets through would read as a guard switched off).
fn cases() -> Vec<(&'static dyn Guard, Case)> {
    let a = Settings::from(&AgentConfig::default());
    guards::ALL
        .iter()
        .filter(|g| g.cel(&a).is_some())
        .flat_map(|g| {
            let canary = g.canary(&a).map(|c| c.case());
            g.cases().into_iter().chain(canary).map(move |c| (*g, c))
        })
        .collect()
}

/// The heart of it: the API-side policies decide each case as the handlers do
/// (`decides_as_the_handlers`).
#[test]
fn each_guards_policy_decides_as_its_handler_case_by_case() {
    decides_as_the_handlers(|cfg, s| {
        admission_policies::render(cfg, s, "clusters-a", served()).expect("render")
    });
}

/// The same tables through the static guards' rendering (`hosted::static_guards`): the files
/// decide each case as the API-side policies and the handlers do.
#[test]
fn each_guards_static_policy_decides_as_its_handler_case_by_case() {
    use super::static_guards::{self, SUFFIX};
    decides_as_the_handlers(|cfg, s| {
        let mut cfg = cfg.clone();
        for w in &mut cfg.webhooks {
            if hcp_fleet_guards::has_cel_form(&w.path) {
                w.engine = hcp_fleet_guards::catalogue::GuardEngine::Static;
            }
        }
        let g = static_guards::render(&cfg, s, "clusters-a", false).expect("render");
        // Looked up by guard name below: the suffix taken off, nothing else changed.
        let unsuffixed = |m: &mut kube::core::ObjectMeta| {
            let name = m.name.take().unwrap_or_default();
            assert!(name.ends_with(SUFFIX), "{name}");
            m.name = Some(name.trim_end_matches(SUFFIX).to_string());
        };
        let mut policies = g.policies;
        let mut bindings = g.bindings;
        policies
            .iter_mut()
            .for_each(|p| unsuffixed(&mut p.metadata));
        bindings
            .iter_mut()
            .for_each(|b| unsuffixed(&mut b.metadata));
        AdmissionPolicies {
            policies,
            bindings,
            revision: g.revision,
            ..Default::default()
        }
    });
}

/// For each case, in enforce and in warn mode, the policy the API server would run (as
/// `render` gives it) and the handler the admission service runs reach the same verdict with
/// the same words, and the verdict is the one the table expects.
fn decides_as_the_handlers(render: impl Fn(&AgentConfig, &Settings) -> AdmissionPolicies) {
    let env = env();
    for mode in [Mode::Enforce, Mode::Warn] {
        let cfg = with_mode(mode);
        let s = Settings::from(&cfg);
        let rendered = render(&cfg, &s);
        for (g, req) in cases() {
            let (guard, what, want) = (g.row().name, req.what, req.want);
            let rust = by_rust(g, &req, &s, mode);
            let cel = by_policy(&env, &rendered, guard, &req);
            assert_eq!(cel, rust, "{guard} ({mode:?}), {what}: CEL and Rust differ");
            let expected_allowed = want == Want::Allow || mode == Mode::Warn;
            assert_eq!(rust.allowed, expected_allowed, "{guard} ({mode:?}), {what}");
            // Warn mode says what enforce would have denied, and nothing else.
            assert_eq!(
                rust.said.is_some(),
                want == Want::Deny,
                "{guard} ({mode:?}), {what}: {rust:?}"
            );
        }
    }
}

/// The cluster's own traffic and a customer's sanctioned work (`guards::traffic`) through
/// every guard, in enforce mode, by the service's decision and, where the guard has one, its
/// policy: nothing of it is denied, on either engine.
#[test]
fn the_clusters_own_traffic_passes_every_guard_on_every_engine() {
    let env = env();
    let cfg = with_mode(Mode::Enforce);
    let s = Settings::from(&cfg);
    let rendered = admission_policies::render(&cfg, &s, "clusters-a", served()).expect("render");
    let mut denied = Vec::new();
    let mut sent = 0;
    for traffic in guards::traffic::corpus() {
        for g in guards::ALL {
            sent += 1;
            let rust = by_rust(*g, &traffic.case, &s, Mode::Enforce);
            if !rust.allowed {
                denied.push(format!(
                    "{} by the service: {} ({:?})",
                    g.row().name,
                    traffic.case.what,
                    rust.said
                ));
            }
            if g.cel(&s).is_some() {
                let cel = by_policy(&env, &rendered, g.row().name, &traffic.case);
                if !cel.allowed {
                    denied.push(format!(
                        "{} by its policy: {} ({:?})",
                        g.row().name,
                        traffic.case.what,
                        cel.said
                    ));
                }
            }
        }
    }
    assert!(sent > 300, "{sent}");
    assert!(
        denied.is_empty(),
        "the cluster's own traffic denied:\n{}",
        denied.join("\n")
    );
}

/// The exemptions as webhook matchConditions (where the hosted server keeps them): for every
/// webhook that carries them, a request they leave out is one the service exempts, and one
/// they let through is judged.
#[test]
fn webhook_match_conditions_leave_out_exactly_whom_the_service_exempts() {
    let env = env();
    let cfg = AgentConfig::default();
    let s = Settings::from(&cfg);
    let hooks = webhooks::render(
        &cfg,
        "clusters-a",
        "https://svc.clusters-a.svc.cluster.local",
        "ca",
        HostedFeatures {
            match_conditions: true,
            admission_policies: false,
            mutating_policies: false,
            static_guards: false,
            static_mutating: false,
            static_offered: false,
        },
        None,
    )
    .expect("render");
    let validating = hooks.validating.expect("validating");
    let mut checked = 0;
    for (g, req) in cases() {
        let (what, want) = (req.what, req.want);
        let Some(hook) = validating
            .webhooks
            .iter()
            .flatten()
            .find(|w| w.name == g.row().name)
        else {
            continue;
        };
        let conditions = hook.match_conditions.clone().unwrap_or_default();
        assert!(!conditions.is_empty(), "{}: no matchConditions", hook.name);
        let request = req.request();
        let vars: [(&str, &Value); 3] = [
            ("request", &request),
            ("object", &req.object),
            ("oldObject", &req.old),
        ];
        let called = conditions
            .iter()
            .all(|c| eval_bool(&env, &c.expression, &vars));
        let rust = by_rust(g, &req, &s, Mode::Enforce);
        if !called {
            assert!(
                rust.allowed,
                "{}, {what}: left out by CEL, denied by the service",
                hook.name
            );
        }
        // A denial the table expects must reach the service.
        if want == Want::Deny {
            assert!(
                called,
                "{}, {what}: left out by CEL but the guard must deny it",
                hook.name
            );
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} cases reached a webhook");
}

/// Where the server knows no matchConditions, the conditions are left out and the service
/// exempts on its own: nothing in the table depends on CEL there.
#[test]
fn without_match_conditions_the_webhooks_carry_no_cel() {
    let hooks = webhooks::render(
        &AgentConfig::default(),
        "clusters-a",
        "https://svc.clusters-a.svc.cluster.local",
        "ca",
        HostedFeatures::default(),
        None,
    )
    .expect("render");
    for w in hooks
        .validating
        .iter()
        .flat_map(|v| v.webhooks.iter().flatten())
    {
        assert!(
            w.match_conditions.as_ref().is_none_or(Vec::is_empty),
            "{}",
            w.name
        );
    }
}

/// The probe policy denies exactly the labelled ConfigMap its binding selects (its own CEL is
/// the constant `false`; the selection is the binding's).
#[test]
fn the_probe_policy_denies_whatever_reaches_it() {
    let env = env();
    let rendered = admission_policies::render(
        &AgentConfig::default(),
        &Settings::from(&AgentConfig::default()),
        "ns",
        served(),
    )
    .expect("render");
    let probe = rendered
        .policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(admission_policies::probe_name()))
        .expect("probe policy");
    let v = &probe
        .spec
        .as_ref()
        .expect("spec")
        .validations
        .as_ref()
        .expect("v")[0];
    assert!(!eval_bool(&env, &v.expression, &[]));
}

/// Each `x-kubernetes-validations` rule of the agent's CRDs, with `self` bound as the API
/// server binds it (the value at the rule's place in the schema).
fn crd_rules() -> Vec<(String, String, String)> {
    fn walk(v: &Value, path: &str, out: &mut Vec<(String, String, String)>) {
        let Some(map) = v.as_object() else { return };
        if let Some(rules) = map
            .get("x-kubernetes-validations")
            .and_then(Value::as_array)
        {
            for r in rules {
                out.push((
                    path.to_string(),
                    r["rule"].as_str().unwrap_or_default().to_string(),
                    r["message"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        if let Some(props) = map.get("properties").and_then(Value::as_object) {
            for (k, p) in props {
                walk(p, &format!("{path}.{k}"), out);
            }
        }
        if let Some(items) = map.get("items") {
            walk(items, &format!("{path}[]"), out);
        }
    }
    let mut out = Vec::new();
    for crd in hcp_fleet_model::crd::health::crds() {
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
            walk(&version["schema"]["openAPIV3Schema"], &kind, &mut out);
        }
    }
    out
}

/// The values at `path` (`Kind.spec.guards[]`) of an object, as `self` for a rule there.
fn at_path<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut here = vec![obj];
    for part in path.split('.').skip(1) {
        let (key, each) = match part.strip_suffix("[]") {
            Some(k) => (k, true),
            None => (part, false),
        };
        here = here
            .into_iter()
            .filter_map(|v| v.get(key))
            .flat_map(|v| match (each, v.as_array()) {
                (true, Some(items)) => items.iter().collect::<Vec<_>>(),
                _ => vec![v],
            })
            .collect();
    }
    here
}

#[test]
fn the_crd_rules_parse_and_are_the_ones_the_cases_cover() {
    let env = env();
    let rules = crd_rules();
    let places: BTreeSet<&str> = rules.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(
        places,
        BTreeSet::from([
            "HostedAdmissionOverride.spec.exemptGroups",
            "HostedAdmissionOverride.spec.exemptUsers",
            "HostedAdmissionOverride.spec.guards",
            "HostedAdmissionOverride.spec.guards[]",
        ]),
        "a rule was added or moved: give it cases in override_cases"
    );
    for (path, rule, _) in &rules {
        env.compile(rule)
            .unwrap_or_else(|e| panic!("{path}: {rule}: does not parse: {e:?}"));
    }
}

/// Overrides: (what, spec, refused by a CRD rule).
fn override_cases() -> Vec<(&'static str, Value, bool)> {
    let guard = |name: &str, mode: &str| json!({"name": name, "mode": mode});
    vec![
        (
            "a guard on warn",
            json!({"guards": [guard("scc.hcp-fleet.openshift.io", "warn")]}),
            false,
        ),
        (
            "two guards",
            json!({"guards": [guard("scc.hcp-fleet.openshift.io", "warn"), guard("featuregate.hcp-fleet.openshift.io", "off")]}),
            false,
        ),
        (
            "a guard named twice",
            json!({"guards": [guard("scc.hcp-fleet.openshift.io", "warn"), guard("scc.hcp-fleet.openshift.io", "off")]}),
            true,
        ),
        (
            "the probe",
            json!({"guards": [guard("probe.hcp-fleet.openshift.io", "off")]}),
            true,
        ),
        ("an exempt user", json!({"exemptUsers": ["alice"]}), false),
        ("every user", json!({"exemptUsers": ["alice", "*"]}), true),
        (
            "anonymous",
            json!({"exemptUsers": ["system:anonymous"]}),
            true,
        ),
        (
            "an exempt group",
            json!({"exemptGroups": ["team-a"]}),
            false,
        ),
        (
            "every authenticated user",
            json!({"exemptGroups": ["system:authenticated"]}),
            true,
        ),
        (
            "every anonymous one",
            json!({"exemptGroups": ["system:unauthenticated"]}),
            true,
        ),
        (
            "every service account",
            json!({"exemptGroups": ["team-a", "system:serviceaccounts"]}),
            true,
        ),
        ("nothing", json!({}), false),
    ]
}

/// Whatever the CRD's rules refuse, the agent refuses too (1.20 runs no CEL, so the agent's
/// check is the one that holds there); and what they accept, the agent accepts where nothing
/// else is wrong.
#[test]
fn the_override_crds_rules_and_the_agents_check_agree() {
    let env = env();
    let rules = crd_rules();
    let base = AgentConfig::default();
    let fleet = crate::rollout::Revision::of(&base);
    for (what, spec, refused) in override_cases() {
        let obj = json!({"spec": spec});
        let mut by_cel = Vec::new();
        for (path, rule, message) in &rules {
            for value in at_path(&obj, path) {
                if !eval_bool(&env, rule, &[("self", value)]) {
                    by_cel.push(message.clone());
                }
            }
        }
        assert_eq!(!by_cel.is_empty(), refused, "{what}: CEL said {by_cel:?}");
        let typed: hcp_fleet_model::crd::admission_rollout::HostedAdmissionOverrideSpec =
            serde_json::from_value(spec.clone()).expect("spec");
        let r = crate::overrides::resolve(&base, &fleet, |_| None, Some(&typed));
        let verdict = r.verdict.expect("verdict");
        assert_eq!(
            !verdict.accepted, refused,
            "{what}: the agent said {verdict:?}"
        );
    }
}

/// Every function or macro a shipped expression calls is one both CEL implementations have.
#[test]
fn every_shipped_expression_uses_only_covered_functions() {
    let env = env();
    let mut expressions: Vec<String> = Vec::new();
    for mode in [Mode::Enforce, Mode::Warn] {
        let rendered = admission_policies::render(
            &with_mode(mode),
            &Settings::from(&with_mode(mode)),
            "ns",
            served(),
        )
        .expect("render");
        for p in &rendered.policies {
            let spec = p.spec.as_ref().expect("spec");
            expressions.extend(
                spec.match_conditions
                    .iter()
                    .flatten()
                    .map(|c| c.expression.clone()),
            );
            for v in spec.validations.iter().flatten() {
                expressions.push(v.expression.clone());
                expressions.extend(v.message_expression.clone());
            }
        }
    }
    // The mutating policies', their typed constructions written as maps (cel-rust has none).
    let rendered = admission_policies::render(
        &with_mode(Mode::Enforce),
        &Settings::from(&with_mode(Mode::Enforce)),
        "ns",
        served(),
    )
    .expect("render");
    for p in &rendered.mutating {
        let spec = &p.data["spec"];
        for c in spec["matchConditions"].as_array().into_iter().flatten() {
            expressions.extend(c["expression"].as_str().map(String::from));
        }
        for m in spec["mutations"].as_array().into_iter().flatten() {
            expressions.extend(
                m["applyConfiguration"]["expression"]
                    .as_str()
                    .map(super::cel_mutation_cases::as_maps),
            );
        }
    }
    // Every mutation's form where its guard has one under the cases' registry (the pod image
    // spec's is not rendered yet).
    let with_registry = Settings {
        internal_registry: Some(guards::pod_image_spec::case_registry()),
        ..Settings::from(&with_mode(Mode::Enforce))
    };
    for g in guards::ALL {
        if let Some(f) = g.mutation(&with_registry) {
            expressions.push(f.applies);
            expressions.extend(f.variables.into_iter().map(|(_, e)| e));
            expressions.push(super::cel_mutation_cases::as_maps(&f.apply_configuration));
        }
    }
    expressions.extend(crd_rules().into_iter().map(|(_, r, _)| r));
    assert!(expressions.len() > 20);
    for e in &expressions {
        let program: Program = env
            .compile(e)
            .unwrap_or_else(|err| panic!("{e}: does not parse: {err:?}"));
        let refs = program.references();
        for f in refs.functions() {
            let operator = f.starts_with('_') || f.starts_with('@') || f == "!_" || f == "-_";
            assert!(
                operator || COVERED.contains(&f),
                "{e}: calls {f}, which the test does not know both CEL implementations to have"
            );
        }
    }
}
