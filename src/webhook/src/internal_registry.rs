//! What the service knows of the hosted cluster's internal registry (the pod image spec
//! mutation's input, `hcp_fleet_guards::pod_image_spec`): a JSON file, the agent's ConfigMap
//! as the kubelet mounts it (an optional volume: absent until the agent writes one). Read at
//! start and whenever the file changes, never per request; a file that cannot be read as the
//! agent writes it leaves the last good one in force.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hcp_fleet_guards::pod_image_spec::InternalRegistry;

use crate::server::AppState;

/// A ConfigMap holds at most 1 MiB; a larger file is no ConfigMap of the agent's.
const MAX_BYTES: u64 = 1 << 20;

/// What tells one version of the file from the next: the kubelet's atomic writer puts each
/// in a new file behind the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    ino: u64,
    len: u64,
    mtime_ns: i64,
}

fn version(path: &Path) -> Option<Version> {
    let m = std::fs::metadata(path).ok()?;
    Some(Version {
        ino: m.ino(),
        len: m.len(),
        mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
    })
}

/// The file's registry: `Ok(None)` where there is no file (nothing known: nothing rewritten).
pub fn load(path: &Path) -> Result<Option<InternalRegistry>, String> {
    let text = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
        Ok(m) if m.len() > MAX_BYTES => {
            return Err(format!(
                "{}: {} bytes, more than a ConfigMap holds",
                path.display(),
                m.len()
            ));
        }
        Ok(_) => std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?,
    };
    // An empty file: the ConfigMap without the key (or its volume emptied).
    if text.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&text).map(Some).map_err(|e| {
        format!(
            "{}: not the agent's internal registry JSON: {e}",
            path.display()
        )
    })
}

/// Reads `path` into `state`: a new table is taken, a file that cannot be read as the agent
/// writes it leaves the last good one.
fn refresh(path: &Path, state: &AppState) {
    match load(path) {
        Ok(reg) => {
            let state_now = reg.as_ref().and_then(|r| r.management_state.clone());
            let tags = reg.as_ref().map_or(0, |r| r.tags.len());
            if state.set_internal_registry(reg) {
                tracing::info!(
                    management_state = state_now.as_deref().unwrap_or("unknown"),
                    tags,
                    "internal registry read"
                );
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "internal registry file unusable; keeping what was read before");
        }
    }
}

/// Reads `path` into `state` now, before the first request (so a replica never answers
/// without what the file says), then after every change, checking every `every`.
pub fn watch(path: PathBuf, state: Arc<AppState>, every: Duration) -> tokio::task::JoinHandle<()> {
    let mut seen = version(&path);
    refresh(&path, &state);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = version(&path);
            if now != seen {
                seen = now;
                refresh(&path, &state);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_file_is_nothing_known_and_a_bad_one_an_error() {
        let dir = std::env::temp_dir().join(format!("hcp-fleet-registry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let p = dir.join("internal-registry.json");
        assert_eq!(load(&p), Ok(None));
        std::fs::write(&p, "").expect("write");
        assert_eq!(load(&p), Ok(None));
        std::fs::write(&p, "{not json").expect("write");
        assert!(load(&p).is_err());
        let reg = hcp_fleet_guards::pod_image_spec::case_registry();
        std::fs::write(&p, serde_json::to_vec(&reg).expect("json")).expect("write");
        assert_eq!(load(&p), Ok(Some(reg)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
