//! Where the test bed's binaries are: an explicit directory, then KUBEBUILDER_ASSETS, then the
//! cache that `hack/testbed-assets.sh` fills.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::LocalCpError;

/// The version `hack/testbed-assets.sh` builds; its cache directory is named after it.
pub const KUBE_VERSION: &str = "v1.20.2";

#[derive(Debug, Clone)]
pub struct Assets {
    pub dir: PathBuf,
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
    pub kubectl: PathBuf,
}

/// The cache directory the asset script writes to (same rules as the script).
pub fn default_cache_dir() -> Option<PathBuf> {
    let root = if let Some(d) = std::env::var_os("HCP_FLEET_ASSETS_CACHE") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        PathBuf::from(d).join("hcp-fleet-agent")
    } else {
        PathBuf::from(std::env::var_os("HOME")?)
            .join(".cache")
            .join("hcp-fleet-agent")
    };
    Some(root.join("assets").join(KUBE_VERSION))
}

impl Assets {
    pub fn resolve(explicit: Option<&Path>) -> Result<Self, LocalCpError> {
        if let Some(dir) = explicit {
            return Self::check(dir);
        }
        if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
            return Self::check(Path::new(&dir));
        }
        match default_cache_dir() {
            Some(dir) => Self::check(&dir),
            None => Err(LocalCpError::Assets {
                dir: PathBuf::from("$HOME/.cache/hcp-fleet-agent"),
                problem: "KUBEBUILDER_ASSETS is unset and HOME is unknown".into(),
            }),
        }
    }

    /// Every binary present and executable.
    pub fn check(dir: &Path) -> Result<Self, LocalCpError> {
        let mut problems = Vec::new();
        let mut find = |name: &str| {
            let p = dir.join(name);
            match std::fs::metadata(&p) {
                Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
                Ok(_) => problems.push(format!("{name} is not an executable file")),
                Err(_) => problems.push(format!("{name} is missing")),
            }
            p
        };
        let assets = Assets {
            dir: dir.to_path_buf(),
            kube_apiserver: find("kube-apiserver"),
            etcd: find("etcd"),
            kubectl: find("kubectl"),
        };
        if problems.is_empty() {
            Ok(assets)
        } else {
            Err(LocalCpError::Assets {
                dir: dir.to_path_buf(),
                problem: problems.join(", "),
            })
        }
    }
}
