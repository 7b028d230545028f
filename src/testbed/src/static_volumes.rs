//! The test bed's kubelet for the hosted kube-apiservers' static guards (docs/static-guards.md):
//! each hosted server of 1.36 and later runs with the feature gate
//! `ManifestBasedAdmissionControlConfig` and an admission configuration whose two policy
//! directories are, as in a HyperShift pod, ConfigMap volumes: the policies key and the
//! mutating policies key of the HCP namespace's `hcp-fleet-static-guards`, each in its own
//! directory, `optional: true` (empty until the agent writes it). This task
//! keeps each directory as a kubelet's atomic writer does: the file under a fresh hidden
//! directory, the `..data` link swapped to it by a rename, the file itself a link through
//! `..data`; so the server sees one change, never half a file. Only the directory differs from
//! a real pod's (the test bed's state directory, not `staticGuards.mountPath`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use hcp_fleet_render::hosted::static_guards::{
    CONFIG_MAP, MUTATING_POLICIES_DIR, MUTATING_POLICIES_KEY, POLICIES_DIR, POLICIES_KEY,
};

/// The admission configuration file of one hosted server and the root its policy
/// directories are under, created before it starts (each directory empty: the server
/// requires them to exist).
pub(crate) fn prepare(server_dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    let root = server_dir.join("static-guards");
    for dir in [POLICIES_DIR, MUTATING_POLICIES_DIR] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    let config = root.join("admission-config.yaml");
    std::fs::write(
        &config,
        hcp_fleet_render::hosted::static_guards::admission_configuration(&root.to_string_lossy()),
    )?;
    Ok((config, root))
}

/// Watches the management cluster's static guard ConfigMaps and writes each key into its
/// directory under its hosted server's root (`roots`: HCP namespace to root), as two volumes
/// of the one ConfigMap would be. Runs until aborted.
pub(crate) fn spawn(management: Client, roots: BTreeMap<String, PathBuf>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let cms = Api::<ConfigMap>::all(management);
        let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
        let mut events = std::pin::pin!(watcher(cms, config).default_backoff());
        while let Some(ev) = events.next().await {
            let (cm, present) = match ev {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => (cm, true),
                Ok(watcher::Event::Delete(cm)) => (cm, false),
                _ => continue,
            };
            let Some(root) = cm.namespace().and_then(|ns| roots.get(&ns)) else {
                continue;
            };
            for (key, dir) in [
                (POLICIES_KEY, POLICIES_DIR),
                (MUTATING_POLICIES_KEY, MUTATING_POLICIES_DIR),
            ] {
                // A deleted ConfigMap of an optional volume (or a missing key): the kubelet
                // empties the volume.
                let text = present
                    .then(|| cm.data.as_ref().and_then(|d| d.get(key)).cloned())
                    .flatten()
                    .unwrap_or_default();
                let dir = root.join(dir);
                if let Err(e) = write_atomically(&dir, key, &text) {
                    tracing::warn!(dir = %dir.display(), error = %e, "test bed: writing static guards");
                }
            }
        }
    })
}

/// One key's file in `dir` as the kubelet's atomic writer lays it out.
fn write_atomically(dir: &Path, key: &str, text: &str) -> std::io::Result<()> {
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir(&fresh)?;
    // An empty volume holds no file at all.
    if !text.is_empty() {
        std::fs::write(fresh.join(key), text)?;
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data"))?;
    let link = dir.join(key);
    if text.is_empty() {
        let _ = std::fs::remove_file(&link);
    } else if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(Path::new("..data").join(key), &link)?;
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_swapped_whole_and_emptied_as_a_kubelet_does() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        write_atomically(dir, "policies.yaml", "one").expect("write");
        assert_eq!(
            std::fs::read_to_string(dir.join("policies.yaml")).expect("read"),
            "one"
        );
        write_atomically(dir, "policies.yaml", "two").expect("write");
        assert_eq!(
            std::fs::read_to_string(dir.join("policies.yaml")).expect("read"),
            "two"
        );
        // Only the current payload directory is left.
        let hidden = std::fs::read_dir(dir)
            .expect("list")
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .count();
        assert_eq!(hidden, 1);
        write_atomically(dir, "policies.yaml", "").expect("write");
        assert!(std::fs::symlink_metadata(dir.join("policies.yaml")).is_err());
    }
}
