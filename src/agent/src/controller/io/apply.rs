//! Writing what the agent owns, after Stackable's `ClusterResources`: server-side apply under
//! the agent's one field manager, only where the live object differs, and pruning of owned
//! objects that are no longer wanted. The same helpers serve management-side objects and the
//! webhook configurations in hosted clusters.

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use hcp_fleet_render::management::FIELD_MANAGER;

/// How often a forced apply is tried when the server reports a write race.
const APPLY_ATTEMPTS: usize = 3;

/// Server-side apply by the agent's field manager (forced: the agent owns these fields).
///
/// A forced apply has no field conflicts, but a write by someone else between the server's
/// read and its write can still end in 409 "the object has been modified" (seen on 1.20 when
/// the test bed's kubelet annotates the Service the agent is applying). The apply carries no
/// resourceVersion, so trying again at once is safe and is what the server would have done.
pub(crate) async fn apply<K>(api: &Api<K>, name: &str, obj: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    // Strict: a field the server does not know is an error, not silently dropped (servers
    // before 1.23 ignore the directive).
    let params = PatchParams::apply(FIELD_MANAGER)
        .force()
        .validation_strict();
    let mut attempt = 1;
    loop {
        match api.patch(name, &params, &Patch::Apply(obj)).await {
            Err(kube::Error::Api(s)) if is_write_race(&s) && attempt < APPLY_ATTEMPTS => {
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn is_write_race(s: &kube::core::Status) -> bool {
    s.code == 409 && s.reason == "Conflict"
}

/// What `apply_if_changed` did, with the object as the server has it afterwards.
pub(crate) enum Applied<K> {
    /// The live object already said what was rendered; nothing was written.
    Unchanged(K),
    /// There was none; it was created.
    Created(K),
    /// It differed and was written.
    Updated(K),
}

impl<K> Applied<K> {
    pub(crate) fn object(&self) -> &K {
        match self {
            Applied::Unchanged(k) | Applied::Created(k) | Applied::Updated(k) => k,
        }
    }

    pub(crate) fn into_object(self) -> K {
        match self {
            Applied::Unchanged(k) | Applied::Created(k) | Applied::Updated(k) => k,
        }
    }
}

/// How a differing object is put back.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Repair {
    /// A forced server-side apply: the agent's fields are its own again; fields other
    /// managers set beside them stay (management-side objects, where other controllers may
    /// legitimately add to them).
    Apply,
    /// Owned whole: where another manager set a field under these top-level keys, the object
    /// is replaced by the rendering (at the resourceVersion read, so a concurrent write fails
    /// rather than being overwritten unseen), then applied; otherwise only applied. An apply
    /// never removes a field another manager owns, so a selector a tenant merged into a guard
    /// would stay.
    Whole(&'static [&'static str]),
    /// Owned and compared whole (the hosted guard objects): any difference, whoever wrote it
    /// (a client may claim the agent's own field manager name), is replaced by the rendering
    /// at the resourceVersion read, then applied. An apply alone would keep a field written
    /// under the agent's name by an `Update`, which is another managedFields entry.
    Replace,
}

/// Applies only what differs from the live object (compared by `same(desired, live)` on their
/// JSON): some API servers (1.20 among them) bump a no-op apply's managedFields timestamp, and
/// with it the resourceVersion, which every watcher then sees as a change. Says what it did.
pub(crate) async fn apply_if_changed<K>(
    api: &Api<K>,
    name: &str,
    desired: &K,
    same: fn(&Value, &Value) -> bool,
    repair: Repair,
) -> Result<Applied<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let live = api.get_opt(name).await?;
    apply_against(api, name, desired, live, same, repair).await
}

/// `apply_if_changed` against a live object already read (from a list of the kind, one
/// request for many objects); `None`: there is none.
pub(crate) async fn apply_against<K>(
    api: &Api<K>,
    name: &str,
    desired: &K,
    live: Option<K>,
    same: fn(&Value, &Value) -> bool,
    repair: Repair,
) -> Result<Applied<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let Some(live) = live else {
        return apply(api, name, desired).await.map(Applied::Created);
    };
    let want = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    let have = serde_json::to_value(&live).map_err(kube::Error::SerdeError)?;
    if same(&want, &have) {
        return Ok(Applied::Unchanged(live));
    }
    let replace = match repair {
        Repair::Apply => false,
        Repair::Whole(under) => {
            !hcp_fleet_model::compare::foreign_to_apply(&have, FIELD_MANAGER, under).is_empty()
        }
        Repair::Replace => true,
    };
    // The agent's own non-Apply entries right after its replace (`own_entries_applied_only`).
    let mut replaced_entries = Vec::new();
    if replace {
        let params = PostParams {
            dry_run: false,
            field_manager: Some(FIELD_MANAGER.into()),
        };
        let mut version = live.meta().resource_version.clone();
        // A write between the read and the replace (a controller's status, a kubelet's) is a
        // conflict: read again and replace at the new version, once; a second conflict is
        // someone writing as fast as the agent repairs, and the reconcile's retry takes it.
        for attempt in 0..2 {
            let mut whole = desired.clone();
            whole.meta_mut().resource_version = version.clone();
            match api.replace(name, &params, &whole).await {
                Err(kube::Error::Api(s)) if s.code == 409 && attempt == 0 => {
                    let fresh = api.get(name).await?;
                    // Put back meanwhile (the drift task's immediate repair and a reconcile
                    // race for the same object): nothing left to do.
                    let now = serde_json::to_value(&fresh).map_err(kube::Error::SerdeError)?;
                    if same(&want, &now) {
                        return Ok(Applied::Unchanged(fresh));
                    }
                    version = fresh.meta().resource_version.clone();
                }
                other => {
                    replaced_entries = agents_other_entries(other?.meta());
                    break;
                }
            }
        }
        // A replace moves no ownership where a value stays the same: a field another manager
        // had set to the rendered value would still be theirs alone, and look foreign at every
        // look. The forced apply after it makes every rendered field the agent's (shared).
    }
    let applied = apply(api, name, desired).await?;
    if replace && matches!(repair, Repair::Whole(_)) {
        return own_entries_applied_only(api, name, applied, &replaced_entries)
            .await
            .map(Applied::Updated);
    }
    Ok(Applied::Updated(applied))
}

/// The entries of the agent's field manager other than its apply (and not of a subresource),
/// as (operation, fields).
fn agents_other_entries(meta: &kube::api::ObjectMeta) -> Vec<(Option<String>, Option<Value>)> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|e| is_agents_other(e))
        .map(|e| {
            (
                e.operation.clone(),
                e.fields_v1.as_ref().map(|f| f.0.clone()),
            )
        })
        .collect()
}

fn is_agents_other(e: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry) -> bool {
    e.manager.as_deref() == Some(FIELD_MANAGER)
        && e.operation.as_deref() != Some("Apply")
        && e.subresource.as_deref().is_none_or(str::is_empty)
}

/// After a replace, the agent's field manager holds an Update entry beside its Apply entry:
/// the fields the replace changed, a server default it put back among them (a
/// `terminationGracePeriodSeconds` someone had changed, say), which its apply does not own.
/// Where only the Apply entry counts as the agent's (`compare::foreign_to_apply`: any client
/// may write under the agent's name), that entry would read as someone else's field at every
/// look. So it goes: the managed fields are written back without it (at the version read; a
/// write that changes nothing but them adds no entry of its own, kube-apiserver 1.36.2). Only
/// while it holds exactly what the replace left (`replaced`): one that has grown since is
/// someone else's write under the agent's name, left for the next look to repair. A conflict
/// (a status written meanwhile) is read again and tried again.
async fn own_entries_applied_only<K>(
    api: &Api<K>,
    name: &str,
    mut live: K,
    replaced: &[(Option<String>, Option<Value>)],
) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..APPLY_ATTEMPTS {
        let now = agents_other_entries(live.meta());
        if now.is_empty() || now != replaced {
            return Ok(live);
        }
        let keep: Vec<_> = live
            .meta()
            .managed_fields
            .iter()
            .flatten()
            .filter(|e| !is_agents_other(e))
            .cloned()
            .collect();
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": live.meta().resource_version,
            "managedFields": keep,
        }});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.patch(name, &params, &Patch::Merge(&patch)).await {
            Err(kube::Error::Api(s)) if s.code == 409 => live = api.get(name).await?,
            other => return other,
        }
    }
    Ok(live)
}

/// Deletes `name` if it exists; a missing object is what was wanted.
pub(crate) async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// One owned object of a kind, by its fixed name: `desired` applied under `name`, or the object
/// deleted when `None`. Nothing is listed: in a hosted cluster any tenant can label objects
/// like the agent's, and a list by that label would hold (and delete) whatever they put there.
pub(crate) async fn apply_or_delete<K>(
    api: &Api<K>,
    name: &str,
    desired: Option<&K>,
    same: fn(&Value, &Value) -> bool,
    repair: Repair,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    match desired {
        Some(d) => {
            apply_if_changed(api, name, d, same, repair).await?;
        }
        None => {
            delete_if_present(api, name).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_write_race_is_retried() {
        let status = |code: u16, reason: &str| {
            let mut s = kube::core::Status::failure("x", reason);
            s.code = code;
            s
        };
        assert!(is_write_race(&status(409, "Conflict")));
        assert!(!is_write_race(&status(409, "AlreadyExists")));
        assert!(!is_write_race(&status(403, "Forbidden")));
        assert!(!is_write_race(&status(422, "Invalid")));
    }
}
