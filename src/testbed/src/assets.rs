//! Where the test bed's binaries are: an explicit directory, then KUBEBUILDER_ASSETS, then the
//! cache that `hack/testbed-assets.sh` fills.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::LocalCpError;

/// The version `hack/testbed-assets.sh` builds; its cache directory is named after it.
pub(crate) const KUBE_VERSION: &str = "v1.20.2";

#[derive(Debug, Clone)]
pub struct Assets {
    pub dir: PathBuf,
    pub(crate) kube_apiserver: PathBuf,
    /// The hosted clusters' controller manager (`data_plane`), of the same version.
    pub(crate) kube_controller_manager: PathBuf,
    pub(crate) etcd: PathBuf,
    pub kubectl: PathBuf,
    /// What `kube-apiserver --version` says, so the test bed passes only the flags that
    /// version accepts (any binaries from 1.20 up, ours or a user's own).
    pub version: KubeVersion,
    /// What `etcd --version` says (`None` where it names none): a 1.31+ kube-apiserver serves
    /// consistent lists from its cache only over etcd 3.5.13+ (progress requests), so a
    /// benchmark's figures say which etcd they ran on.
    pub etcd_version: Option<String>,
}

/// HyperShift's own HostedControlPlane CRD, as its project ships it (uses CEL rules: 1.25+).
pub const UPSTREAM_HCP_CRD: &str = "hostedcontrolplanes-Hypershift-Default.crd.yaml";
/// ACM's Policy CRD, an older release whose compliance enum has no `Pending`.
pub const UPSTREAM_POLICY_CRD: &str = "policy.open-cluster-management.io_policies.yaml";
/// ACM's Policy CRD as its propagator ships it today (with `Pending`): what the management
/// cluster gets where it is provided (`LocalFleet::policy_crd`).
pub const UPSTREAM_POLICY_CRD_CURRENT: &str =
    "policy.open-cluster-management.io_policies-current.yaml";

impl Assets {
    /// An upstream CRD the asset script placed beside the binaries (`upstream-crds/`), else
    /// one in `HCP_FLEET_UPSTREAM_CRDS` (set by `hack/test.sh` for binaries the user brought):
    /// reference data from the projects themselves, used where the server accepts it.
    pub(crate) fn upstream_crd(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir.join("upstream-crds").join(file))
            .ok()
            .or_else(|| {
                let dir = std::env::var_os("HCP_FLEET_UPSTREAM_CRDS")?;
                std::fs::read_to_string(Path::new(&dir).join(file)).ok()
            })
    }
}

/// A kube-apiserver's major.minor (and the full string it printed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeVersion {
    pub(crate) major: u32,
    pub(crate) minor: u32,
    pub full: String,
}

impl KubeVersion {
    /// From `kube-apiserver --version` output: `Kubernetes v1.36.2` (forks may add suffixes,
    /// e.g. `v1.36.2-rc.1+abc`).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let v = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('v'))?
            .to_string();
        let mut parts = v.split(['.', '-', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Self {
            major,
            minor,
            full: format!("v{v}"),
        })
    }

    /// `--insecure-port` was removed in 1.24: passing it makes the server exit.
    pub(crate) fn has_insecure_port_flag(&self) -> bool {
        (self.major, self.minor) < (1, 24)
    }

    /// The beta group versions a server before 1.22 serves by default and 1.22 removed, turned
    /// off as `--runtime-config` where they exist: a hosted cluster of the fleet (1.30+) serves
    /// none of them, and each one costs a 1.20 server CPU at start-up and again at every CRD
    /// change (the OpenAPI document it rebuilds is that much larger). Measured on 1.20.2 here:
    /// 4.8 CPU-s to ready instead of about 5.3, and 0.8 CPU-s per CRD created instead of 1.2
    /// (docs/testbed.md, "What a run costs"). `policy/v1beta1` and `discovery.k8s.io/v1beta1`
    /// went later (1.25) and stay: a 1.20 server has no v1 of either (the agent writes its
    /// PodDisruptionBudget as `policy/v1beta1` there).
    pub(crate) fn removed_betas(&self) -> Option<String> {
        const REMOVED_IN_1_22: &[&str] = &[
            "admissionregistration.k8s.io/v1beta1",
            "apiextensions.k8s.io/v1beta1",
            "authentication.k8s.io/v1beta1",
            "authorization.k8s.io/v1beta1",
            "autoscaling/v2beta1",
            "autoscaling/v2beta2",
            "batch/v1beta1",
            "certificates.k8s.io/v1beta1",
            "coordination.k8s.io/v1beta1",
            "extensions/v1beta1",
            "networking.k8s.io/v1beta1",
            "node.k8s.io/v1beta1",
            "rbac.authorization.k8s.io/v1beta1",
            "scheduling.k8s.io/v1beta1",
            "storage.k8s.io/v1beta1",
        ];
        // 1.20 and 1.21 serve every one of them; an older server lacks some, and naming a
        // group version a server does not know makes it exit.
        ((self.major, self.minor) >= (1, 20) && (self.major, self.minor) < (1, 22)).then(|| {
            let off: Vec<String> = REMOVED_IN_1_22
                .iter()
                .map(|gv| format!("{gv}=false"))
                .collect();
            format!("--runtime-config={}", off.join(","))
        })
    }

    /// Enforces a CRD's CEL rules (`x-kubernetes-validations`, 1.25); before that, server-side
    /// apply refuses the field.
    pub(crate) fn has_cel(&self) -> bool {
        self.serves(Feature::CrdCel)
    }

    /// At least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Whether this server has `feature` (by the release that made it on by default).
    pub fn serves(&self, feature: Feature) -> bool {
        let (major, minor) = feature.since();
        self.at_least(major, minor)
    }
}

/// What a test-bed server may lack: the e2e suite runs on Debian's 1.20 and on any newer
/// binaries `KUBEBUILDER_ASSETS` names, and skips only the assertions of a feature the server
/// lacks, saying so in one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `policy/v1` PodDisruptionBudgets (1.21).
    PolicyV1,
    /// CRD validation rules (`x-kubernetes-validations`, CEL) and strict field validation
    /// (1.25).
    CrdCel,
    /// Webhook `matchConditions` (beta, on by default, in 1.28).
    MatchConditions,
    /// `admissionregistration.k8s.io/v1` ValidatingAdmissionPolicy (1.30).
    AdmissionPolicies,
    /// Admission policies loaded from files (1.36, alpha: the test bed turns the feature gate
    /// `ManifestBasedAdmissionControlConfig` on for its hosted servers).
    StaticManifests,
    /// `admissionregistration.k8s.io/v1` MutatingAdmissionPolicy (GA, on by default, in 1.36).
    MutatingPolicies,
}

impl Feature {
    /// The release from which it is served by default.
    pub fn since(self) -> (u32, u32) {
        match self {
            Feature::PolicyV1 => (1, 21),
            Feature::CrdCel => (1, 25),
            Feature::MatchConditions => (1, 28),
            Feature::AdmissionPolicies => (1, 30),
            Feature::StaticManifests => (1, 36),
            Feature::MutatingPolicies => (1, 36),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Feature::PolicyV1 => "policy/v1 PodDisruptionBudgets",
            Feature::CrdCel => "CRD validation rules (CEL) and strict field validation",
            Feature::MatchConditions => "webhook matchConditions",
            Feature::AdmissionPolicies => "ValidatingAdmissionPolicy",
            Feature::StaticManifests => {
                "admission policies loaded from files (ManifestBasedAdmissionControlConfig)"
            }
            Feature::MutatingPolicies => "MutatingAdmissionPolicy",
        }
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full)
    }
}

/// The cache directory the asset script writes to (same rules as the script).
pub(crate) fn default_cache_dir() -> Option<PathBuf> {
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
    pub(crate) fn check(dir: &Path) -> Result<Self, LocalCpError> {
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
        let kube_apiserver = find("kube-apiserver");
        let kube_controller_manager = find("kube-controller-manager");
        let etcd = find("etcd");
        let kubectl = find("kubectl");
        let version = if problems.is_empty() {
            let out = std::process::Command::new(&kube_apiserver)
                .arg("--version")
                .output();
            let text = out
                .as_ref()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            let v = KubeVersion::parse(&text);
            if v.is_none() {
                problems.push(format!(
                    "kube-apiserver --version did not name a version (said {:?})",
                    text.trim()
                ));
            }
            v
        } else {
            None
        };
        if let (true, Some(version)) = (problems.is_empty(), version) {
            let etcd_version = std::process::Command::new(&etcd)
                .arg("--version")
                .output()
                .ok()
                .and_then(|o| etcd_version(&String::from_utf8_lossy(&o.stdout)));
            Ok(Assets {
                dir: dir.to_path_buf(),
                kube_apiserver,
                kube_controller_manager,
                etcd,
                kubectl,
                version,
                etcd_version,
            })
        } else {
            Err(LocalCpError::Assets {
                dir: dir.to_path_buf(),
                problem: problems.join(", "),
            })
        }
    }
}

/// The version in `etcd --version`'s output ("etcd Version: 3.4.23" on its first line).
fn etcd_version(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("etcd Version:"))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcds_version_is_read_from_its_output() {
        let debian = "etcd Version: 3.4.23\nGit SHA: Not provided (use ./build instead of go build)\nGo Version: go1.19.8\n";
        assert_eq!(etcd_version(debian).as_deref(), Some("3.4.23"));
        assert_eq!(
            etcd_version("flag provided but not defined: -version\n"),
            None
        );
        assert_eq!(etcd_version("etcd Version: \n"), None);
    }

    #[test]
    fn versions_are_read_from_the_binary_output() {
        let v = KubeVersion::parse("Kubernetes v1.20.2\n").expect("1.20");
        assert_eq!((v.major, v.minor), (1, 20));
        assert!(v.has_insecure_port_flag());
        let off = v.removed_betas().expect("1.20 serves them");
        assert!(off.starts_with("--runtime-config=admissionregistration.k8s.io/v1beta1=false,"));
        assert!(!off.contains("policy/") && !off.contains("discovery.k8s.io"));
        let v = KubeVersion::parse("Kubernetes v1.36.2-rc.0+abcdef").expect("1.36");
        assert_eq!(v.removed_betas(), None);
        assert_eq!((v.major, v.minor), (1, 36));
        assert!(!v.has_insecure_port_flag());
        assert!(v.at_least(1, 30) && !v.at_least(1, 37));
        assert!(KubeVersion::parse("garbage").is_none());
    }
}
