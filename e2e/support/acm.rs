//! ACM's side of reporting, played by the e2e suite on real API servers: ACM's code cannot
//! run in the test bed, so each function here is one step of the governance-policy-framework
//! addon (open-cluster-management-io/governance-policy-framework-addon), following its source:
//! `controllers/specsync/policy_spec_sync.go`, `controllers/templatesync/template_sync.go`,
//! `controllers/statussync/policy_status_sync.go` and `eventPredicate.go`. What the addon does
//! with objects other than the agent's template kind (ConfigurationPolicies, Gatekeeper) is
//! left out; what it does with the agent's kind is not.
#![allow(dead_code)]

use hcp_fleet_model::crd::policy::TemplateMeta;
use hcp_fleet_model::crd::{
    AdmissionHealthPolicy, ComplianceHistory, Policy, PolicyStatus, TemplateDetails,
};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client, Resource, ResourceExt};

/// ACM's labels on a replicated Policy and on the templates synced from it (propagator's
/// `common.ClusterNameLabel` / `ClusterNamespaceLabel`, `RootPolicyLabel`).
pub const CLUSTER_NAME: &str = "policy.open-cluster-management.io/cluster-name";
pub const CLUSTER_NAMESPACE: &str = "policy.open-cluster-management.io/cluster-namespace";
pub const ROOT_POLICY: &str = "policy.open-cluster-management.io/root-policy";
/// The label template-sync looks for on a CRD before it syncs that kind.
pub const TEMPLATE_KIND_LABEL: &str = "policy.open-cluster-management.io/policy-type";
const POLICY_API_VERSION: &str = "policy.open-cluster-management.io/v1";

/// The hub objects `make policies` writes (policies/policy.yaml).
pub fn hub_objects() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../policies/policy.yaml"
    ))
    .expect("policies/policy.yaml");
    serde_saphyr::from_str_multiple(&text).expect("yaml")
}

/// The root Policy named `name` among the hub objects, and its replica name
/// (`<namespace>.<name>`, the propagator's).
pub fn root_policy(docs: &[serde_json::Value], name: &str) -> (serde_json::Value, String) {
    let root = docs
        .iter()
        .find(|d| d["kind"] == "Policy" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Policy {name} in policies/policy.yaml"))
        .clone();
    let replica = format!(
        "{}.{}",
        root["metadata"]["namespace"].as_str().expect("namespace"),
        root["metadata"]["name"].as_str().expect("name")
    );
    (root, replica)
}

/// Spec-sync (`policy_spec_sync.go`, `Reconcile`): the propagator's replica of `root` for
/// managed cluster `cluster`, copied from the hub into `namespace` on the managed side (the
/// cluster's own namespace, or `klusterlet-<cluster>` with hosted-mode addons), with the
/// propagator's labels.
pub async fn spec_sync(
    client: &Client,
    root: &serde_json::Value,
    replica_name: &str,
    namespace: &str,
    cluster: &str,
) -> Policy {
    hcp_fleet_testbed::fixtures::ensure_namespace(client, namespace, Default::default())
        .await
        .expect("the addon's namespace");
    let replica: Policy = serde_json::from_value(serde_json::json!({
        "apiVersion": POLICY_API_VERSION, "kind": "Policy",
        "metadata": {
            "name": replica_name,
            "namespace": namespace,
            "labels": {
                ROOT_POLICY: replica_name,
                CLUSTER_NAME: cluster,
                CLUSTER_NAMESPACE: cluster,
            },
        },
        "spec": root["spec"],
    }))
    .expect("replica");
    Api::<Policy>::namespaced(client.clone(), namespace)
        .create(&Default::default(), &replica)
        .await
        .expect("the replicated Policy")
}

/// The labelled-CRD cache (template-sync syncs a kind only if its CRD carries
/// `policy.open-cluster-management.io/policy-type: template`): the kinds it would sync.
pub async fn template_kinds(client: &Client) -> Vec<String> {
    let lp = kube::api::ListParams::default().labels(&format!("{TEMPLATE_KIND_LABEL}=template"));
    Api::<CustomResourceDefinition>::all(client.clone())
        .list(&lp)
        .await
        .expect("list CRDs")
        .items
        .into_iter()
        .map(|c| c.spec.names.kind)
        .collect()
}

/// Template-sync (`template_sync.go`, `Reconcile`, the not-found branch) for template `index`
/// of the replicated Policy `policy`: the object as the Policy defines it, with the Policy's
/// cluster labels added and the Policy as its controller owner, created with strict field
/// validation where the server has it (`strict`). `edit` changes the object first, as a Policy
/// written by hand would. A kind not in the labelled-CRD cache is refused, as template-sync
/// refuses it.
pub async fn template_sync(
    client: &Client,
    policy: &Policy,
    index: usize,
    strict: bool,
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<AdmissionHealthPolicy, String> {
    let mut object = policy
        .spec
        .policy_templates
        .get(index)
        .ok_or("no such template")?
        .object_definition
        .clone();
    edit(&mut object);
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    if !template_kinds(client).await.contains(&kind) {
        return Err(format!("{kind} is not a policy template kind"));
    }
    let ns = policy.namespace().unwrap_or_default();
    let labels = policy.labels();
    let meta = &mut object["metadata"];
    meta["namespace"] = ns.clone().into();
    for (k, from) in [
        ("cluster-name", CLUSTER_NAME),
        (CLUSTER_NAME, CLUSTER_NAME),
        ("cluster-namespace", CLUSTER_NAMESPACE),
        (CLUSTER_NAMESPACE, CLUSTER_NAMESPACE),
    ] {
        meta["labels"][k] = labels.get(from).cloned().unwrap_or_default().into();
    }
    meta["ownerReferences"] = owned_by(&policy.name_any(), &policy.uid().unwrap_or_default());
    let url = format!(
        "/apis/{}/namespaces/{ns}/{}{}",
        object["apiVersion"].as_str().unwrap_or_default(),
        AdmissionHealthPolicy::plural(&()),
        if strict {
            "?fieldValidation=Strict"
        } else {
            ""
        }
    );
    let body = serde_json::to_vec(&object).map_err(|e| e.to_string())?;
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(body)
        .map_err(|e| e.to_string())?;
    client
        .request::<AdmissionHealthPolicy>(req)
        .await
        .map_err(|e| format!("Failed to create policy template: {e}"))
}

/// The owner references template-sync gives a template: its replicated Policy, as controller.
pub fn owned_by(policy: &str, uid: &str) -> serde_json::Value {
    serde_json::json!([{
        "apiVersion": POLICY_API_VERSION, "kind": "Policy",
        "name": policy, "uid": uid, "controller": true, "blockOwnerDeletion": true,
    }])
}

/// Template-sync's `emitTemplateError`: a compliance Event on the Policy saying the template
/// could not be synced, named as client-go names Events (`<policy>.<hex nanoseconds>`).
pub async fn emit_template_error(client: &Client, policy: &Policy, template: &str, msg: &str) {
    let ns = policy.namespace().unwrap_or_default();
    let now = jiff::Timestamp::now();
    let seconds = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let event: Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{}.{:x}", policy.name_any(), now.as_nanosecond()), "namespace": ns},
        "firstTimestamp": seconds, "lastTimestamp": seconds, "count": 1,
        "involvedObject": {"apiVersion": POLICY_API_VERSION, "kind": "Policy",
            "name": policy.name_any(), "namespace": ns, "uid": policy.uid()},
        "reason": format!("policy: {ns}/{template}"),
        "message": format!("NonCompliant; template-error; {msg}"),
        "type": "Warning",
    }))
    .expect("event");
    Api::<Event>::namespaced(client.clone(), &ns)
        .create(&Default::default(), &event)
        .await
        .expect("template-sync's error");
}

/// The template name in a compliance Event's reason, as status-sync's regular expression
/// `(?i)^policy:\s*(?:([a-z0-9.-]+)\s*\/)?(.+)` reads it (`getEventsInCluster`).
pub fn reason_template(reason: &str) -> Option<&str> {
    let rest = reason
        .get(..7)
        .filter(|p| p.eq_ignore_ascii_case("policy:"))
        .map(|_| reason[7..].trim_start())?;
    // The optional `<namespace>/` group: lower-case letters, digits, '.' and '-' (any case,
    // the expression being case-insensitive), then optional spaces and '/'.
    let ns_end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
        .unwrap_or(rest.len());
    let after_ns = rest[ns_end..].trim_start();
    let name = match after_ns.strip_prefix('/') {
        Some(n) if ns_end > 0 && !n.is_empty() => n,
        _ => rest,
    };
    let name = name.split('\n').next().unwrap_or_default();
    (!name.is_empty()).then_some(name)
}

/// Status-sync (`policy_status_sync.go`, `getDetails`) for one replicated Policy: the
/// compliance Events in its namespace that `eventPredicateFuncs` passes (involved object a
/// `policy.open-cluster-management.io/v1` Policy) with its UID, per template by the reason's
/// template name (`getEventsInCluster`); the agent's template's own `status.history`
/// (`getEventsInTemplate`); merged with the history already in the Policy's status, newest
/// first, an entry within 5 µs of the previous one with its message dropped, at most 10
/// (`mergeDetails`); the compliance from the newest message's prefix. Then written through the
/// status subresource (`updateStatuses`), where ACM's schema must take it.
pub async fn status_sync(client: &Client, p: &Policy) -> Result<PolicyStatus, String> {
    let ns = p.namespace().unwrap_or_default();
    let lp = kube::api::ListParams::default().fields(
        "involvedObject.kind=Policy,involvedObject.apiVersion=policy.open-cluster-management.io/v1",
    );
    let events = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&lp)
        .await
        .map_err(|e| e.to_string())?;
    let mut details = Vec::new();
    let mut overall: Option<&str> = Some("Compliant");
    for t in &p.spec.policy_templates {
        let name = t.object_definition["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let mut hist: Vec<ComplianceHistory> = events
            .items
            .iter()
            .filter(|e| e.involved_object.uid == p.uid())
            .filter(|e| e.reason.as_deref().and_then(reason_template) == Some(name))
            .map(|e| ComplianceHistory {
                event_name: e.metadata.name.clone().unwrap_or_default(),
                last_timestamp: e
                    .last_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                message: e
                    .message
                    .as_deref()
                    .unwrap_or_default()
                    .trim_start_matches("(combined from similar events):")
                    .trim()
                    .to_string(),
            })
            .collect();
        if t.object_definition["kind"] == "AdmissionHealthPolicy" {
            hist.extend(events_in_template(client, &ns, name, &p.name_any()).await?);
        }
        let existing = p
            .status
            .as_ref()
            .and_then(|s| s.details.iter().find(|d| d.template_meta.name == name))
            .map(|d| d.history.clone())
            .unwrap_or_default();
        let history = merge_details(hist, existing);
        let compliant = history.first().map(|h| {
            let m = h.message.trim().to_lowercase();
            if m.starts_with("compliant") {
                "Compliant"
            } else if m.starts_with("pending") {
                "Pending"
            } else {
                "NonCompliant"
            }
        });
        match compliant {
            Some("NonCompliant") => overall = Some("NonCompliant"),
            Some("Pending") if overall != Some("NonCompliant") => overall = Some("Pending"),
            Some(_) => {}
            None if overall == Some("Compliant") => overall = None,
            None => {}
        }
        details.push(TemplateDetails {
            compliant: compliant.map(str::to_string),
            template_meta: TemplateMeta {
                name: name.to_string(),
            },
            history,
        });
    }
    let status = PolicyStatus {
        compliant: overall.map(str::to_string),
        details,
        status: Vec::new(),
    };
    Api::<Policy>::namespaced(client.clone(), &ns)
        .patch_status(
            &p.name_any(),
            &Default::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": status})),
        )
        .await
        .map_err(|e| format!("ACM's schema refused the status: {e}"))?;
    Ok(status)
}

/// `getEventsInTemplate`: the template's `status.history` (MicroTime, message), each entry
/// named `<policy>.<hex nanoseconds>` after its timestamp; entries without either are skipped.
async fn events_in_template(
    client: &Client,
    ns: &str,
    name: &str,
    policy: &str,
) -> Result<Vec<ComplianceHistory>, String> {
    let tmpl = Api::<AdmissionHealthPolicy>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?;
    Ok(tmpl
        .and_then(|t| t.status)
        .map(|s| s.history)
        .unwrap_or_default()
        .into_iter()
        .filter(|h| !h.message.is_empty())
        .filter_map(|h| {
            let at = h.last_timestamp.parse::<jiff::Timestamp>().ok()?;
            Some(ComplianceHistory {
                event_name: format!("{policy}.{:x}", at.as_nanosecond()),
                last_timestamp: h.last_timestamp.clone(),
                message: h.message.trim().to_string(),
            })
        })
        .collect())
}

/// `mergeDetails`: the history already on the Policy kept where no new entry has its event
/// name; every entry's time from its event name where it has one (client-go's hex
/// nanoseconds); newest first; an entry with the previous one's message within 5 µs of it
/// dropped; at most 10.
pub fn merge_details(
    mut events: Vec<ComplianceHistory>,
    existing: Vec<ComplianceHistory>,
) -> Vec<ComplianceHistory> {
    for old in existing {
        if !events.iter().any(|e| e.event_name == old.event_name) {
            events.push(old);
        }
    }
    let at = |h: &ComplianceHistory| -> i128 {
        h.event_name
            .rsplit_once('.')
            .and_then(|(_, hex)| i128::from_str_radix(hex, 16).ok())
            .or_else(|| {
                h.last_timestamp
                    .parse::<jiff::Timestamp>()
                    .ok()
                    .map(|t| t.as_nanosecond())
            })
            .unwrap_or_default()
    };
    let mut timed: Vec<(i128, ComplianceHistory)> =
        events.into_iter().map(|h| (at(&h), h)).collect();
    timed.sort_by_key(|(t, _)| std::cmp::Reverse(*t));
    let mut out: Vec<ComplianceHistory> = Vec::new();
    for (i, (t, h)) in timed.iter().enumerate() {
        if out.len() == 10 {
            break;
        }
        let too_similar =
            i > 0 && (timed[i - 1].0 - t).abs() < 5_000 && timed[i - 1].1.message == h.message;
        if !too_similar {
            out.push(h.clone());
        }
    }
    out
}

/// What the hub shows for template `template` of replicated Policy `name` in `ns`, after one
/// status-sync: its compliance and history.
pub async fn hub_row(
    client: &Client,
    ns: &str,
    name: &str,
    template: &str,
) -> Result<(String, Vec<ComplianceHistory>), String> {
    let p = Api::<Policy>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let status = status_sync(client, &p).await?;
    let d = status
        .details
        .into_iter()
        .find(|d| d.template_meta.name == template)
        .ok_or("no details for the template")?;
    Ok((d.compliant.unwrap_or_default(), d.history))
}

/// Every object template of the ConfigurationPolicies in the hub objects (`hub_objects`):
/// (complianceType, objectDefinition).
pub fn object_templates(docs: &[serde_json::Value]) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for policy in docs.iter().filter(|d| d["kind"] == "Policy") {
        for t in policy["spec"]["policy-templates"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let def = &t["objectDefinition"];
            if def["kind"] != "ConfigurationPolicy" {
                continue;
            }
            for o in def["spec"]["object-templates"]
                .as_array()
                .into_iter()
                .flatten()
            {
                out.push((
                    o["complianceType"]
                        .as_str()
                        .unwrap_or("musthave")
                        .to_string(),
                    o["objectDefinition"].clone(),
                ));
            }
        }
    }
    out
}

/// What config-policy-controller makes of an existing value under an object template's
/// value of the same key (open-cluster-management-io/config-policy-controller,
/// `controllers/configurationpolicy_controller.go`, `mergeSpecs` and `mergeArrays`): maps are
/// merged key by key (keys only the existing value has are kept); a list is, for
/// `mustonlyhave`, the template's list; for `musthave`, the existing list with every template
/// item that no existing item already holds (each template item matched at most once)
/// appended; anything else is the template's value.
pub fn merge_spec(
    template: &serde_json::Value,
    existing: &serde_json::Value,
    ctype: &str,
) -> serde_json::Value {
    use serde_json::Value;
    match (template, existing) {
        (Value::Object(t), Value::Object(e)) => {
            let mut out = e.clone();
            for (k, tv) in t {
                let merged = merge_spec(tv, e.get(k).unwrap_or(&Value::Null), ctype);
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(t), Value::Array(e)) => {
            if ctype == "mustonlyhave" {
                return template.clone();
            }
            let mut out = e.clone();
            let mut used = vec![false; e.len()];
            for item in t {
                let found = e
                    .iter()
                    .enumerate()
                    .position(|(i, ex)| !used[i] && holds(item, ex));
                match found {
                    Some(i) => used[i] = true,
                    None => out.push(item.clone()),
                }
            }
            Value::Array(out)
        }
        _ => template.clone(),
    }
}

/// Does `existing` hold every field of `template` at the same value (lists by items)?
fn holds(template: &serde_json::Value, existing: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (template, existing) {
        (Value::Object(t), Value::Object(e)) => t
            .iter()
            .all(|(k, v)| e.get(k).is_some_and(|ev| holds(v, ev))),
        (Value::Array(t), Value::Array(e)) => t.iter().all(|tv| e.iter().any(|ev| holds(tv, ev))),
        _ => template == existing,
    }
}

/// Two values equal but for the order of list items (config-policy-controller's
/// `equalObjWithSort` sorts lists before comparing).
fn same_unordered(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_unordered(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            let mut used = vec![false; y.len()];
            x.len() == y.len()
                && x.iter().all(|v| {
                    let hit = y
                        .iter()
                        .enumerate()
                        .position(|(i, w)| !used[i] && same_unordered(v, w));
                    hit.map(|i| used[i] = true).is_some()
                })
        }
        _ => a == b,
    }
}

/// One look of config-policy-controller, enforcing, at the cluster-scoped object one object
/// template names: created when missing (`musthave`, `mustonlyhave`), deleted when present
/// (`mustnothave`), else each top-level field but apiVersion, kind and metadata merged
/// (`merge_spec`) and, if that changed anything, written back whole (an update). Returns
/// whether it wrote.
pub async fn enforce(
    client: &Client,
    resource: &kube::core::ApiResource,
    ctype: &str,
    template: &serde_json::Value,
) -> Result<bool, kube::Error> {
    use kube::api::{DynamicObject, PostParams};
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    let name = template["metadata"]["name"].as_str().unwrap_or_default();
    let Some(live) = api.get_opt(name).await? else {
        if ctype == "mustnothave" {
            return Ok(false);
        }
        let obj: DynamicObject =
            serde_json::from_value(template.clone()).map_err(kube::Error::SerdeError)?;
        api.create(&PostParams::default(), &obj).await?;
        return Ok(true);
    };
    if ctype == "mustnothave" {
        api.delete(name, &Default::default()).await?;
        return Ok(true);
    }
    let mut whole = serde_json::to_value(&live).map_err(kube::Error::SerdeError)?;
    let mut changed = false;
    for (k, tv) in template.as_object().into_iter().flatten() {
        if ["apiVersion", "kind", "metadata"].contains(&k.as_str()) {
            continue;
        }
        let merged = merge_spec(tv, &whole[k.as_str()], ctype);
        if !same_unordered(&merged, &whole[k.as_str()]) {
            whole[k.as_str()] = merged;
            changed = true;
        }
    }
    if changed {
        let obj: DynamicObject = serde_json::from_value(whole).map_err(kube::Error::SerdeError)?;
        api.replace(name, &PostParams::default(), &obj).await?;
    }
    Ok(changed)
}
