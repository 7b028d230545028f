//! How the agent decides that a live object already says what it rendered: every field it
//! renders is there with the same value, after the server's defaulting. A leaf module; both
//! the management-side objects and the hosted webhook configurations are compared this way.

use serde_json::Value;

/// Every field of `desired` is in `live` with the same value (recursively; arrays
/// element-wise and of the same length, so a removed or added list entry is a difference).
/// Fields only the server sets (defaults, status, metadata it keeps) are ignored.
pub fn subset(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d
            .iter()
            .all(|(k, dv)| l.get(k).is_some_and(|lv| subset(dv, lv))),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(x, y)| subset(x, y))
        }
        _ => desired == live,
    }
}

/// Where `live` does not say exactly what `desired` says, as dotted paths (`[i]` for a list
/// entry): a rendered field missing or different, a list of another length, or a field the
/// rendering does not have that is not a server default at its default value (`defaults`:
/// the same shape as the object, a list's one element standing for each of its elements).
/// Nothing here reads who wrote the difference: a field written under the agent's own field
/// manager name, which any client can claim, is a difference like any other.
/// `at` names the compared part in the paths.
pub fn differences(desired: &Value, live: &Value, defaults: &Value, at: &str) -> Vec<String> {
    let mut out = Vec::new();
    diff_into(desired, live, defaults, at.to_string(), &mut out);
    out
}

fn diff_into(desired: &Value, live: &Value, defaults: &Value, at: String, out: &mut Vec<String>) {
    let key = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => {
            for (k, dv) in d {
                match l.get(k) {
                    Some(lv) => diff_into(dv, lv, &defaults[k.as_str()], key(k), out),
                    None => out.push(key(k)),
                }
            }
            for (k, lv) in l {
                if d.contains_key(k) {
                    continue;
                }
                // Absent from the rendering: only the server's default, at its value.
                let dv = &defaults[k.as_str()];
                if dv.is_null() || !default_holds(dv, lv) {
                    out.push(key(k));
                }
            }
        }
        (Value::Array(d), Value::Array(l)) if d.len() == l.len() => {
            for (i, (x, y)) in d.iter().zip(l).enumerate() {
                diff_into(x, y, &defaults[0], format!("{at}[{i}]"), out);
            }
        }
        _ if desired == live => {}
        _ => out.push(at),
    }
}

/// `live` is a field's server default as `default` describes it: the value itself, or for
/// an object, only defaulted fields at their values.
fn default_holds(default: &Value, live: &Value) -> bool {
    match (default, live) {
        (Value::Object(d), Value::Object(l)) => l
            .iter()
            .all(|(k, lv)| d.get(k).is_some_and(|dv| default_holds(dv, lv))),
        _ => default == live,
    }
}

/// The fields under `under` (top-level keys such as `spec`) that a field manager other than
/// `ours` set on `live` and `ours` does not own, from its `metadata.managedFields`, each as
/// `path (by manager)`. For an object the agent renders whole: a field it does not render but
/// someone else added (a selector that makes a guard match nothing, say) is drift all the
/// same, while a server default, which no manager owns, is not. Status writes (the `status`
/// subresource) never count.
pub fn foreign_fields(live: &Value, ours: &str, under: &[&str]) -> Vec<String> {
    foreign_by(live, under, |manager, _| {
        (manager != ours).then(|| manager.to_string())
    })
}

/// What a writer under the name `ours` that did not apply is called in `foreign_to_apply`'s
/// paths: any client may claim a field manager's name, so only the agent's apply is its own.
pub fn not_applied(ours: &str) -> String {
    format!("{ours}, by an Update: not the agent's apply")
}

/// `foreign_fields` where only `ours`'s Apply entry is the agent's: a field set under its name
/// by any other operation (`kubectl patch --field-manager=<ours>`) is foreign, named as
/// `not_applied`. The agent keeps its own other entries out (`controller::apply`, after a
/// replace), so what one holds is someone else's.
pub fn foreign_to_apply(live: &Value, ours: &str, under: &[&str]) -> Vec<String> {
    foreign_by(live, under, |manager, operation| {
        if manager != ours {
            Some(manager.to_string())
        } else if operation.is_none_or(|o| o == "Apply") {
            None
        } else {
            Some(not_applied(ours))
        }
    })
}

/// The paths under `under` owned by an entry `foreign` names (by manager and operation: the
/// writer's name, `None` for the agent's own) and by no entry of the agent's own.
fn foreign_by(
    live: &Value,
    under: &[&str],
    foreign: impl Fn(&str, Option<&str>) -> Option<String>,
) -> Vec<String> {
    let Some(entries) = live["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    let in_scope = |p: &str| {
        under.iter().any(|u| {
            p.strip_prefix(u)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        })
    };
    let mut mine = std::collections::BTreeSet::new();
    let mut theirs = std::collections::BTreeSet::new();
    for e in entries {
        if e["subresource"].as_str().is_some_and(|s| !s.is_empty()) {
            continue;
        }
        let manager = e["manager"].as_str().unwrap_or_default();
        let who = foreign(manager, e["operation"].as_str());
        let mut paths = Vec::new();
        field_paths(&e["fieldsV1"], "", &mut paths);
        for p in paths.into_iter().filter(|p| in_scope(p)) {
            match &who {
                None => {
                    mine.insert(p);
                }
                Some(w) => {
                    theirs.insert((p, w.clone()));
                }
            }
        }
    }
    theirs
        .into_iter()
        .filter(|(p, _)| !mine.contains(p))
        .map(|(p, m)| format!("{p} (by {m})"))
        .collect()
}

/// `foreign_fields` for a record someone reads (a drift note, a log line): the first three,
/// each cut to 160 characters without control characters (the paths and the manager names are
/// whoever wrote the object's own text), and how many more; `None` for none.
pub fn summary(foreign: &[String]) -> Option<String> {
    const SHOWN: usize = 3;
    const EACH: usize = 160;
    if foreign.is_empty() {
        return None;
    }
    let mut shown: Vec<String> = foreign
        .iter()
        .take(SHOWN)
        .map(|f| f.chars().filter(|c| !c.is_control()).take(EACH).collect())
        .collect();
    if foreign.len() > SHOWN {
        shown.push(format!("and {} more", foreign.len() - SHOWN));
    }
    Some(shown.join(", "))
}

/// `fields_v1` (one managedFields entry's set) cut down to the subtrees at `under` (dotted
/// paths of fields, such as `spec.template.spec`); `None` when nothing of it is there. A
/// watch's store keeps only this much of each entry: what `foreign_fields` reads of them.
pub fn prune_fields(fields_v1: &Value, under: &[&str]) -> Option<Value> {
    let mut out = serde_json::Map::new();
    for path in under {
        let mut node = fields_v1;
        let keys: Vec<String> = path.split('.').map(|k| format!("f:{k}")).collect();
        if keys.iter().all(|k| match node.get(k) {
            Some(next) => {
                node = next;
                true
            }
            None => false,
        }) {
            // Rebuild the chain down to the kept subtree.
            let mut kept = node.clone();
            for k in keys.iter().rev() {
                kept = serde_json::json!({ k.clone(): kept });
            }
            merge(&mut out, kept);
        }
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// The managed-field entries of `entries` (manager, `fieldsV1`) as `foreign_fields` reads
/// them, reduced to what it would report: `ours`'s entries dropped and every other manager's
/// set without the fields `ours` also owns; entries left with nothing are dropped. For a
/// watch's store: the agent's own set of a Deployment's pod spec was most of what a store
/// kept of it, read only to be subtracted (`make bench`, heaptrack).
pub fn foreign_only(entries: Vec<(String, Value)>, ours: &str) -> Vec<(String, Value)> {
    let mut mine = serde_json::Map::new();
    let mut theirs = Vec::new();
    for (manager, fields) in entries {
        if manager == ours {
            merge(&mut mine, fields);
        } else {
            theirs.push((manager, fields));
        }
    }
    let mine = Value::Object(mine);
    theirs
        .into_iter()
        .filter_map(|(m, f)| {
            let left = without_owned(f.as_object()?, Some(&mine));
            (!left.is_empty()).then_some((m, Value::Object(left)))
        })
        .collect()
}

/// `theirs` (a `fieldsV1` node) without the paths `ours` (the node at the same place in the
/// agent's set) also names, path for path as `field_paths` spells them: a leaf, or a node's
/// `.`, names the node's own path, which `ours` names by a leaf or a `.` of its own.
fn without_owned(
    theirs: &serde_json::Map<String, Value>,
    ours: Option<&Value>,
) -> serde_json::Map<String, Value> {
    let names_itself = |o: Option<&Value>| {
        o.is_some_and(|o| {
            o.as_object()
                .is_none_or(|m| m.is_empty() || m.contains_key("."))
        })
    };
    let mut left = serde_json::Map::new();
    for (key, child) in theirs {
        if key == "." {
            if !names_itself(ours) {
                left.insert(key.clone(), child.clone());
            }
            continue;
        }
        let counterpart = ours.and_then(|o| o.get(key));
        match child.as_object().filter(|m| !m.is_empty()) {
            None => {
                if !names_itself(counterpart) {
                    left.insert(key.clone(), child.clone());
                }
            }
            Some(children) => {
                let rest = without_owned(children, counterpart);
                if !rest.is_empty() {
                    left.insert(key.clone(), Value::Object(rest));
                }
            }
        }
    }
    left
}

fn merge(into: &mut serde_json::Map<String, Value>, v: Value) {
    if let Value::Object(m) = v {
        for (k, val) in m {
            match (into.get_mut(&k), val) {
                (Some(Value::Object(existing)), Value::Object(more)) => {
                    merge(existing, Value::Object(more))
                }
                (_, val) => {
                    into.insert(k, val);
                }
            }
        }
    }
}

/// Every path a `fieldsV1` set names (`f:spec` as `spec`, a list entry `k:{"name":"x"}` as
/// `[name=x]`, `v:…` as `[…]`, `i:3` as `[3]`), a node owning itself (`.`) included.
fn field_paths(node: &Value, prefix: &str, out: &mut Vec<String>) {
    let Some(map) = node.as_object() else { return };
    for (key, child) in map {
        if key == "." {
            if !prefix.is_empty() {
                out.push(prefix.to_string());
            }
            continue;
        }
        let part = if let Some(f) = key.strip_prefix("f:") {
            if prefix.is_empty() {
                f.to_string()
            } else {
                format!("{prefix}.{f}")
            }
        } else if let Some(k) = key.strip_prefix("k:") {
            let fields = serde_json::from_str::<serde_json::Map<String, Value>>(k)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| match v.as_str() {
                            Some(s) => format!("{k}={s}"),
                            None => format!("{k}={v}"),
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_else(|_| k.to_string());
            format!("{prefix}[{fields}]")
        } else if let Some(v) = key.strip_prefix("v:").or_else(|| key.strip_prefix("i:")) {
            format!("{prefix}[{v}]")
        } else {
            format!("{prefix}.{key}")
        };
        if child.as_object().is_none_or(|m| m.is_empty()) {
            out.push(part);
        } else {
            field_paths(child, &part, out);
        }
    }
}

/// A fingerprint of a desired object, to tell "the same desired state as last time" from a
/// changed one. In memory only (the hash is not stable across builds).
pub fn fingerprint(desired: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    desired.to_string().hash(&mut h);
    h.finish()
}

/// A hash that is the same in every build and on every machine (FNV-1a, 64 bits, as 16 hex
/// digits), for what is written to the cluster and compared by a later agent.
pub fn stable_hash(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(std::iter::once(&0xff)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_are_not_differences() {
        let desired = json!({"spec": {"ports": [{"port": 443}]}});
        let live = json!({"spec": {"ports": [{"port": 443, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}, "status": {}});
        assert!(subset(&desired, &live));
    }

    #[test]
    fn a_changed_missing_or_extra_entry_is_a_difference() {
        let desired = json!({"data": {"a": "x"}, "list": [1, 2]});
        assert!(!subset(
            &desired,
            &json!({"data": {"a": "y"}, "list": [1, 2]})
        ));
        assert!(!subset(&desired, &json!({"data": {}, "list": [1, 2]})));
        assert!(!subset(&desired, &json!({"data": {"a": "x"}, "list": [1]})));
        assert!(!subset(
            &desired,
            &json!({"data": {"a": "x"}, "list": [1, 2, 3]})
        ));
        assert!(!subset(&desired, &Value::Null));
    }

    fn managed(entries: Value) -> Value {
        json!({"metadata": {"name": "x", "managedFields": entries}})
    }

    #[test]
    fn fields_only_another_manager_set_are_foreign_and_named() {
        let live = managed(json!([
            {"manager": "hcp-fleet-agent", "operation": "Apply", "fieldsV1": {
                "f:metadata": {"f:labels": {"f:a": {}}},
                "f:spec": {"f:policyName": {}, "f:validationActions": {}},
            }},
            {"manager": "kubectl-patch", "operation": "Update", "fieldsV1": {
                "f:metadata": {"f:labels": {"f:mine": {}}},
                "f:spec": {"f:matchResources": {".": {}, "f:objectSelector": {"f:matchLabels": {".": {}, "f:x": {}}}}},
            }},
            {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status",
             "fieldsV1": {"f:status": {"f:typeChecking": {}}}},
        ]));
        assert_eq!(
            foreign_fields(&live, "hcp-fleet-agent", &["spec"]),
            [
                "spec.matchResources (by kubectl-patch)",
                "spec.matchResources.objectSelector.matchLabels (by kubectl-patch)",
                "spec.matchResources.objectSelector.matchLabels.x (by kubectl-patch)",
            ]
        );
        // Out of scope (metadata) and status are never foreign.
        assert!(foreign_fields(&live, "hcp-fleet-agent", &["status"]).is_empty());
        assert_eq!(
            foreign_fields(&live, "hcp-fleet-agent", &["metadata"]).len(),
            1
        );
    }

    #[test]
    fn a_field_both_own_and_a_server_default_are_not_foreign() {
        let entry = |m: &str| {
            json!({"manager": m, "operation": "Apply", "fieldsV1": {
                "f:webhooks": {"k:{\"name\":\"g.example.com\"}": {".": {}, "f:name": {}, "f:rules": {}}},
            }})
        };
        // The same value applied by someone else too: co-owned.
        let live = managed(json!([entry("hcp-fleet-agent"), entry("tenant")]));
        assert!(foreign_fields(&live, "hcp-fleet-agent", &["webhooks"]).is_empty());
        // A webhook entry only the tenant has, and one field added to ours.
        let live = managed(
            json!([entry("hcp-fleet-agent"), {"manager": "tenant", "operation": "Apply", "fieldsV1": {
                "f:webhooks": {
                    "k:{\"name\":\"evil.example.com\"}": {".": {}, "f:name": {}},
                    "k:{\"name\":\"g.example.com\"}": {"f:matchConditions": {}},
                },
            }}]),
        );
        assert_eq!(
            foreign_fields(&live, "hcp-fleet-agent", &["webhooks"]),
            [
                "webhooks[name=evil.example.com] (by tenant)",
                "webhooks[name=evil.example.com].name (by tenant)",
                "webhooks[name=g.example.com].matchConditions (by tenant)",
            ]
        );
        // No managedFields at all (a server that keeps none): nothing to say.
        assert!(foreign_fields(&json!({"metadata": {}}), "a", &["spec"]).is_empty());
        // A prefix of a key is not the key.
        let live = managed(json!([{"manager": "t", "fieldsV1": {"f:specx": {}}}]));
        assert!(foreign_fields(&live, "a", &["spec"]).is_empty());
    }

    #[test]
    fn pruned_fields_keep_only_the_subtrees_asked_for() {
        let f = json!({
            "f:metadata": {"f:labels": {"f:a": {}}},
            "f:spec": {"f:replicas": {}, "f:template": {"f:metadata": {"f:annotations": {}}, "f:spec": {"f:hostNetwork": {}}}},
            "f:status": {"f:readyReplicas": {}},
        });
        assert_eq!(
            prune_fields(&f, &["spec.template.spec"]),
            Some(json!({"f:spec": {"f:template": {"f:spec": {"f:hostNetwork": {}}}}}))
        );
        assert_eq!(prune_fields(&f, &["spec.selector"]), None);
        assert_eq!(
            prune_fields(&f, &["spec.replicas", "metadata.labels"]),
            Some(json!({"f:spec": {"f:replicas": {}}, "f:metadata": {"f:labels": {"f:a": {}}}}))
        );
        // What is kept reads as the same foreign fields as the whole entry.
        let live = |fields: Value| json!({"metadata": {"managedFields": [{"manager": "m", "fieldsV1": fields}]}});
        let under = ["spec.template.spec"];
        assert_eq!(
            foreign_fields(&live(f.clone()), "a", &under),
            foreign_fields(&live(prune_fields(&f, &under).expect("kept")), "a", &under)
        );
    }

    #[test]
    fn the_foreign_only_entries_read_as_the_same_foreign_fields() {
        let ours = "hcp-fleet-agent";
        let agent = json!({"f:spec": {"f:template": {"f:spec": {
            "f:containers": {"k:{\"name\":\"admission\"}": {".": {}, "f:image": {}, "f:name": {}, "f:env": {}}},
            "f:hostNetwork": {},
            "f:securityContext": {"f:runAsNonRoot": {}},
        }}}});
        let cases = [
            // Nobody else: nothing kept.
            vec![],
            // Someone co-owns a field and adds another, in a list entry and beside it.
            vec![(
                "kubectl-edit",
                json!({"f:spec": {"f:template": {"f:spec": {
                    "f:containers": {"k:{\"name\":\"admission\"}": {"f:image": {}, "f:args": {}}},
                    "f:hostNetwork": {},
                    "f:nodeName": {},
                }}}}),
            )],
            // A node we own as a leaf, which they own field by field, and its own path.
            vec![
                (
                    "tenant",
                    json!({"f:spec": {"f:template": {"f:spec": {
                        "f:containers": {"k:{\"name\":\"admission\"}": {"f:env": {".": {}, "f:x": {}}}},
                        "f:securityContext": {".": {}, "f:runAsNonRoot": {}, "f:runAsUser": {}},
                    }}}}),
                ),
                (
                    "other",
                    json!({"f:spec": {"f:template": {"f:spec": {"f:hostNetwork": {}}}}}),
                ),
            ],
        ];
        for others in cases {
            let mut entries = vec![(ours.to_string(), agent.clone())];
            entries.extend(others.iter().map(|(m, f)| (m.to_string(), f.clone())));
            let as_live = |es: &[(String, Value)]| {
                managed(Value::Array(
                    es.iter()
                        .map(|(m, f)| json!({"manager": m, "operation": "Apply", "fieldsV1": f}))
                        .collect(),
                ))
            };
            let whole = foreign_fields(&as_live(&entries), ours, &["spec.template.spec"]);
            let kept = foreign_only(entries, ours);
            assert_eq!(
                foreign_fields(&as_live(&kept), ours, &["spec.template.spec"]),
                whole
            );
            assert!(
                kept.iter().all(|(m, _)| m != ours),
                "the agent's own set is not kept"
            );
            // Only what is foreign is kept: none of it names a path the agent owns.
            assert_eq!(kept.is_empty(), whole.is_empty(), "{whole:?}");
        }
    }

    #[test]
    fn the_stable_hash_is_fnv1a_and_separates_parts() {
        // FNV-1a 64 of "a" followed by the separator byte, computed by hand.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in [b'a', 0xff] {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(stable_hash(&[b"a"]), format!("{h:016x}"));
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        assert_eq!(stable_hash(&[b"x"]).len(), 16);
    }

    #[test]
    fn fingerprints_tell_desired_states_apart() {
        let a = json!({"data": {"a": "x"}});
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&json!({"data": {"a": "y"}})));
    }
}
