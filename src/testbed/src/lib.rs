//! The local control plane: one etcd, a management kube-apiserver and N hosted
//! kube-apiservers (one `--etcd-prefix` each), with generated certificates and kubeconfigs.
//! `dev` runs on it and every e2e test talks to it. See docs/testbed.md.
//!
//! Dropping a [`LocalFleet`] stops every process and removes its state directory.

pub mod assets;
pub mod data_plane;
pub mod fixtures;
pub mod kubelet;
mod pki;
pub mod platform;
pub mod process;
mod proxy;
mod static_volumes;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use assets::Assets;
use pki::Pki;
use process::ManagedProcess;

/// How long a component may take to answer its readiness check before we give up.
pub(crate) const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, thiserror::Error)]
pub enum LocalCpError {
    #[error(
        "test bed binaries unusable in {dir}: {problem}. Run hack/testbed-assets.sh (or `make assets`) to build them, or point KUBEBUILDER_ASSETS at a directory holding kube-apiserver, kube-controller-manager, etcd and kubectl"
    )]
    Assets { dir: PathBuf, problem: String },
    #[error("{component}: port {port} on 127.0.0.1 is already in use; choose another or free it")]
    PortInUse { component: String, port: u16 },
    #[error("{component}: could not start {program}: {source}")]
    Spawn {
        component: String,
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("{component} exited during start-up ({status}); last lines of its log:\n{log_tail}")]
    Exited {
        component: String,
        status: String,
        log_tail: String,
    },
    #[error(
        "{component} not ready within {timeout:?} (last check: {last_error}); last lines of its log:\n{log_tail}"
    )]
    NotReady {
        component: String,
        timeout: Duration,
        last_error: String,
        log_tail: String,
    },
    #[error("invalid hosted cluster name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("certificates: {0}")]
    Cert(#[from] hcp_fleet_render::certificates::CertError),
    #[error("{context}: {source}")]
    Kube {
        context: String,
        source: kube::Error,
    },
    #[error("kubeconfig for {component}: {reason}")]
    Kubeconfig { component: String, reason: String },
    #[error("CRD {name}: {reason}")]
    Crd { name: String, reason: String },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LocalCpError {
    let context = context.into();
    move |source| LocalCpError::Io { context, source }
}

/// A task stopped when its holder is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What to bring up.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Hosted cluster names; each gets a kube-apiserver and an HCP namespace `clusters-<name>`.
    pub hosted_clusters: Vec<String>,
    /// Where the binaries are; `None` means KUBEBUILDER_ASSETS, then the default cache.
    pub assets_dir: Option<PathBuf>,
    /// A fixed port for the management kube-apiserver; `None` picks a free one.
    pub management_port: Option<u16>,
    pub startup_timeout: Duration,
    /// Extra flags for every kube-apiserver (tests use it to provoke start-up failures).
    pub extra_apiserver_args: Vec<String>,
    /// Parent of the state directory; `None` means the system temp dir.
    pub state_parent: Option<PathBuf>,
    /// Install the project's CRDs and the HCP fixtures on the management cluster.
    pub install_fixtures: bool,
    /// Give each hosted cluster a data plane (`data_plane`): its controller manager, a
    /// scheduler and `nodes` kubelets. On by default, as every real hosted cluster has one.
    pub data_plane: bool,
    pub nodes: usize,
    /// Keep the state directory (logs, kubeconfigs) after stopping, for debugging.
    /// Defaults to the `HCP_FLEET_KEEP_STATE=1` environment variable.
    pub keep_state: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            hosted_clusters: Vec::new(),
            assets_dir: None,
            management_port: None,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            extra_apiserver_args: Vec::new(),
            state_parent: None,
            install_fixtures: true,
            data_plane: true,
            nodes: data_plane::DEFAULT_NODES,
            keep_state: std::env::var_os("HCP_FLEET_KEEP_STATE").is_some_and(|v| v == "1"),
        }
    }
}

impl FleetOptions {
    /// `n` hosted clusters named `hc-1` … `hc-n`.
    pub fn with_hosted(n: usize) -> Self {
        Self {
            hosted_clusters: (1..=n).map(|i| format!("hc-{i}")).collect(),
            ..Self::default()
        }
    }
}

/// One kube-apiserver of the fleet.
pub struct ApiServer {
    pub(crate) name: String,
    pub port: u16,
    pub kubeconfig_path: PathBuf,
    pub kubeconfig_yaml: String,
    args: Vec<String>,
    binary: PathBuf,
    log_path: PathBuf,
    process: Option<ManagedProcess>,
    timeout: Duration,
    /// Where this hosted server loads static guards from (`static_volumes`); `None` for the
    /// management server and servers before 1.36.
    pub(crate) static_dir: Option<PathBuf>,
}

impl ApiServer {
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(ManagedProcess::pid)
    }

    /// An admin client (system:masters).
    pub async fn client(&self) -> Result<Client, LocalCpError> {
        client_from_kubeconfig(&self.name, &self.kubeconfig_yaml).await
    }

    /// Stops this kube-apiserver (to test an unreachable hosted cluster).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop();
        }
    }

    /// Starts (or restarts) it on the same port and waits for `/readyz`.
    pub async fn start(&mut self) -> Result<(), LocalCpError> {
        if self.process.is_some() {
            return Ok(());
        }
        ensure_port_free(&self.name, self.port)?;
        let p = ManagedProcess::spawn(&self.name, &self.binary, &self.args, &self.log_path)?;
        self.process = Some(p);
        let client = self.client().await?;
        let timeout = self.timeout;
        let proc = self.process.as_mut().ok_or_else(|| LocalCpError::Exited {
            component: self.name.clone(),
            status: "stopped".into(),
            log_tail: String::new(),
        })?;
        wait_apiserver_ready(proc, &client, timeout).await
    }
}

/// The running fleet. Dropping it stops everything and removes the state directory.
pub struct LocalFleet {
    // Field order is drop order: the data planes and the static volumes' task, API servers,
    // then etcd, then the directory they wrote into.
    data_planes: BTreeMap<String, data_plane::DataPlane>,
    _static_volumes: Option<AbortOnDrop>,
    pub management: ApiServer,
    pub hosted: BTreeMap<String, ApiServer>,
    /// The Kubernetes version every API server of this fleet runs.
    pub version: assets::KubeVersion,
    /// The etcd version under them, where its binary names one.
    pub etcd_version: Option<String>,
    assets: Assets,
    pki: Pki,
    etcd: ManagedProcess,
    state: tempfile::TempDir,
}

impl LocalFleet {
    pub async fn start(opts: FleetOptions) -> Result<Self, LocalCpError> {
        hcp_fleet_guards::crypto::install_provider();
        for name in &opts.hosted_clusters {
            validate_cluster_name(name)?;
        }
        let assets = Assets::resolve(opts.assets_dir.as_deref())?;
        if let Some(port) = opts.management_port {
            ensure_port_free("management kube-apiserver", port)?;
        }
        let state = match &opts.state_parent {
            Some(p) => tempfile::Builder::new().prefix("hcp-fleet-").tempdir_in(p),
            None => tempfile::Builder::new().prefix("hcp-fleet-").tempdir(),
        }
        .map_err(io("creating the state directory"))?;
        let mut state = state;
        state.disable_cleanup(opts.keep_state);
        let dir = state.path().to_path_buf();
        let pki = Pki::generate(&dir)?;

        let (etcd, etcd_url) = start_etcd(&assets, &dir, opts.startup_timeout).await?;

        let shared = Shared {
            assets: &assets,
            dir: &dir,
            pki: &pki,
            etcd_url: &etcd_url,
            opts: &opts,
        };
        let mut management = new_apiserver(
            "management",
            "/registry-management",
            opts.management_port,
            &shared,
        )?;
        let mut hosted = BTreeMap::new();
        for name in &opts.hosted_clusters {
            hosted.insert(name.clone(), new_hosted_apiserver(name, &shared)?);
        }
        // Spawn them all first so they boot in parallel, then wait for each. On an early
        // return the locals drop in reverse order: API servers, etcd, then the state dir.
        management.spawn()?;
        for s in hosted.values_mut() {
            s.spawn()?;
        }
        management.wait_ready().await?;
        for s in hosted.values_mut() {
            s.wait_ready().await?;
        }
        let dirs: BTreeMap<String, PathBuf> = hosted
            .iter()
            .filter_map(|(name, s)| Some((fixtures::hcp_namespace(name), s.static_dir.clone()?)))
            .collect();
        let static_volumes = if dirs.is_empty() {
            None
        } else {
            Some(AbortOnDrop(static_volumes::spawn(
                management.client().await?,
                dirs,
            )))
        };
        let data_planes = if opts.data_plane {
            start_data_planes(&hosted, &assets, &dir, &pki, opts.nodes).await?
        } else {
            BTreeMap::new()
        };
        let fleet = LocalFleet {
            data_planes,
            _static_volumes: static_volumes,
            management,
            hosted,
            version: assets.version.clone(),
            etcd_version: assets.etcd_version.clone(),
            assets,
            pki,
            etcd,
            state,
        };
        if opts.install_fixtures {
            let mgmt = fleet.management.client().await?;
            fixtures::install_crds(&mgmt, &fleet.hcp_crd(), &fleet.policy_crd()).await?;
            fixtures::create_agent_namespace(&mgmt).await?;
            for (name, s) in &fleet.hosted {
                fixtures::create_hcp(&mgmt, name, &s.kubeconfig_yaml).await?;
                let hosted = s.client().await?;
                fixtures::install_crd_manifests(
                    &hosted,
                    hcp_fleet_model::crd::HOSTED_CRD_MANIFESTS
                        .iter()
                        .map(|(n, y)| (*n, *y)),
                )
                .await?;
            }
        }
        Ok(fleet)
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// An upstream CRD placed beside the binaries by the asset script (see `Assets`).
    pub fn upstream_crd(&self, file: &str) -> Option<String> {
        self.assets.upstream_crd(file)
    }

    /// The HostedControlPlane CRD this fleet's management cluster gets: HyperShift's own
    /// where the server accepts it (CEL rules need 1.25) and the asset script provided it,
    /// else the repository's trimmed one.
    pub fn hcp_crd(&self) -> String {
        self.version
            .has_cel()
            .then(|| self.upstream_crd(assets::UPSTREAM_HCP_CRD))
            .flatten()
            .unwrap_or_else(|| hcp_fleet_model::crd::CRD_MANIFESTS[0].1.to_string())
    }

    /// The Policy CRD this fleet's management cluster gets: ACM's current one where the asset
    /// script or `HCP_FLEET_UPSTREAM_CRDS` provided it, else the repository's trimmed one.
    pub fn policy_crd(&self) -> String {
        self.upstream_crd(assets::UPSTREAM_POLICY_CRD_CURRENT)
            .unwrap_or_else(|| hcp_fleet_model::crd::CRD_MANIFESTS[1].1.to_string())
    }

    /// PIDs of every running process of the fleet.
    pub fn pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.etcd.pid().into_iter().collect();
        v.extend(self.management.pid());
        v.extend(self.hosted.values().filter_map(ApiServer::pid));
        v
    }

    /// A client of hosted cluster `hosted` with a client certificate for `user` in `groups`:
    /// authenticated as that identity (not impersonated), as the cluster's own machinery and
    /// HyperShift's components are (`system:admin` in `system:masters`, a node, a customer).
    pub async fn hosted_client_for(
        &self,
        hosted: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<Client, LocalCpError> {
        let yaml = self
            .pki
            .client_kubeconfig(hosted, &self.hosted_url(hosted)?, user, groups)?;
        client_from_kubeconfig(&format!("{hosted} as {user}"), &yaml).await
    }

    /// A client of hosted cluster `hosted` with a bearer token (a service account's, as a pod
    /// running under it would hold).
    pub async fn hosted_client_with_token(
        &self,
        hosted: &str,
        token: &str,
    ) -> Result<Client, LocalCpError> {
        let yaml = pki::render_token_kubeconfig(
            hosted,
            &self.hosted_url(hosted)?,
            &self.pki.ca.cert_pem,
            token,
        );
        client_from_kubeconfig(&format!("{hosted} with a token"), &yaml).await
    }

    fn hosted_url(&self, hosted: &str) -> Result<String, LocalCpError> {
        self.hosted(hosted)
            .map(ApiServer::url)
            .ok_or_else(|| LocalCpError::InvalidName {
                name: hosted.to_string(),
                reason: "no such hosted cluster".into(),
            })
    }

    /// The data plane of hosted cluster `name` (`FleetOptions::data_plane`).
    pub fn data_plane(&self, name: &str) -> Option<&data_plane::DataPlane> {
        self.data_planes.get(name)
    }

    pub fn hosted(&self, name: &str) -> Option<&ApiServer> {
        self.hosted.get(name)
    }

    pub fn hosted_mut(&mut self, name: &str) -> Option<&mut ApiServer> {
        self.hosted.get_mut(name)
    }

    /// Stops everything now (also done on drop).
    pub fn shutdown(&mut self) {
        for d in self.data_planes.values_mut() {
            d.stop();
        }
        for s in self.hosted.values_mut() {
            s.stop();
        }
        self.management.stop();
        self.etcd.stop();
    }
}

impl Drop for LocalFleet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl ApiServer {
    fn spawn(&mut self) -> Result<(), LocalCpError> {
        ensure_port_free(&self.name, self.port)?;
        self.process = Some(ManagedProcess::spawn(
            &self.name,
            &self.binary,
            &self.args,
            &self.log_path,
        )?);
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<(), LocalCpError> {
        let client = self.client().await?;
        let timeout = self.timeout;
        match self.process.as_mut() {
            Some(p) => wait_apiserver_ready(p, &client, timeout).await,
            None => Err(LocalCpError::Exited {
                component: self.name.clone(),
                status: "not started".into(),
                log_tail: String::new(),
            }),
        }
    }
}

/// Each hosted cluster's data plane (`data_plane`), once its kube-apiserver is ready.
async fn start_data_planes(
    hosted: &BTreeMap<String, ApiServer>,
    assets: &Assets,
    dir: &Path,
    pki: &Pki,
    nodes: usize,
) -> Result<BTreeMap<String, data_plane::DataPlane>, LocalCpError> {
    let mut out = BTreeMap::new();
    for (name, s) in hosted {
        let dp = data_plane::start(data_plane::Start {
            name,
            server: &s.url(),
            dir: &dir.join(name),
            kcm_binary: &assets.kube_controller_manager,
            has_insecure_port_flag: assets.version.has_insecure_port_flag(),
            pki,
            nodes,
        })
        .await?;
        out.insert(name.clone(), dp);
    }
    Ok(out)
}

/// A hosted kube-apiserver authorizes and admits as a real one does: the Node authorizer before
/// RBAC, the `NodeRestriction` plugin judging the kubelets, and the `ServiceAccount` plugin on
/// (it needs the controller manager's token controller, which the data plane runs).
fn as_a_hosted_cluster(args: &mut Vec<String>) {
    args.retain(|a| {
        !a.starts_with("--authorization-mode=") && !a.starts_with("--disable-admission-plugins=")
    });
    args.push("--authorization-mode=Node,RBAC".into());
    args.push("--enable-admission-plugins=NodeRestriction".into());
}

/// Now, as the API keeps a Time: RFC 3339 in whole seconds.
pub(crate) fn api_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The test bed's API servers listen on loopback ports, which the agent's default
/// `hostedAccess.allowedServers` refuses; the test bed's configuration allows them by name.
pub(crate) const LOOPBACK_SERVERS: &str = "https://127.0.0.1:*";

/// `cfg` with the test bed's loopback API servers allowed.
pub fn allow_loopback(
    mut cfg: hcp_fleet_render::config::AgentConfig,
) -> hcp_fleet_render::config::AgentConfig {
    let allowed = &mut cfg.hosted_access.allowed_servers;
    if !allowed.iter().any(|a| a == LOOPBACK_SERVERS) {
        allowed.push(LOOPBACK_SERVERS.into());
    }
    cfg
}

/// The test bed's agent configuration file (YAML): the defaults, with loopback allowed.
pub fn agent_config_yaml() -> String {
    format!(
        "hostedAccess:\n  allowedServers:\n  - \"https://kube-apiserver.{{namespace}}.svc:*\"\n  - \"{LOOPBACK_SERVERS}\"\n"
    )
}

/// Hosted cluster names become namespace and etcd-prefix parts: DNS-1123 labels only.
pub(crate) fn validate_cluster_name(name: &str) -> Result<(), LocalCpError> {
    let bad = |reason: &str| LocalCpError::InvalidName {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() || name.len() > 40 {
        return Err(bad("must be 1 to 40 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(bad("only lower-case letters, digits and '-'"));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(bad("must start and end with a letter or digit"));
    }
    Ok(())
}

fn ensure_port_free(component: &str, port: u16) -> Result<(), LocalCpError> {
    TcpListener::bind(("127.0.0.1", port))
        .map(drop)
        .map_err(|_| LocalCpError::PortInUse {
            component: component.to_string(),
            port,
        })
}

/// A port free right now, for a child process to listen on a moment later.
///
/// Chosen outside the kernel's ephemeral range: the kernel hands those ports to every
/// outgoing connection, so one picked there could be taken by a connection of any test
/// running beside it before the child binds it (seen: a hosted kube-apiserver exiting with
/// "address already in use"). Outside it only a listener can take a port, and this process
/// never hands out the same one twice. Should a child still lose the race, the start-up check
/// reports its log line instead of hanging.
pub fn free_port() -> Result<u16, LocalCpError> {
    use std::hash::BuildHasher;
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let (lo, hi) = ephemeral_range();
    let (start, end) = if lo >= 11_000 {
        (10_000, lo)
    } else {
        (hi.saturating_add(1), u16::MAX)
    };
    let span = u64::from(end.saturating_sub(start));
    if span >= 1_000 {
        // Where to start looking: random per call, so parallel test processes seldom meet.
        let offset = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for i in 0..span.min(4_096) {
            let Ok(port) = u16::try_from(u64::from(start) + offset.wrapping_add(i) % span) else {
                continue;
            };
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return Ok(port);
            }
        }
    }
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(io("picking a free port"))?;
    let port = l.local_addr().map_err(io("picking a free port"))?.port();
    Ok(port)
}

/// The kernel's ephemeral port range (Linux; the usual default elsewhere).
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut it = text.split_whitespace().map(str::parse::<u16>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .unwrap_or((32_768, 60_999))
}

async fn start_etcd(
    assets: &Assets,
    dir: &Path,
    timeout: Duration,
) -> Result<(ManagedProcess, String), LocalCpError> {
    let client_port = free_port()?;
    let peer_port = free_port()?;
    let data = dir.join("etcd-data");
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let args: Vec<String> = vec![
        "--name=local".into(),
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=local={peer_url}"),
        "--log-level=warn".into(),
        "--logger=zap".into(),
    ];
    let mut p = ManagedProcess::spawn("etcd", &assets.etcd, &args, &dir.join("etcd.log"))?;
    let deadline = Instant::now() + timeout;
    let mut last_error: String;
    loop {
        if let Some(status) = p.exited() {
            return Err(LocalCpError::Exited {
                component: "etcd".into(),
                status,
                log_tail: p.log_tail(20),
            });
        }
        match etcd_health(client_port).await {
            Ok(()) => return Ok((p, client_url)),
            Err(e) => last_error = e,
        }
        if Instant::now() > deadline {
            return Err(LocalCpError::NotReady {
                component: "etcd".into(),
                timeout,
                last_error,
                log_tail: p.log_tail(20),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn etcd_health(port: u16) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf);
        if text.contains("\"health\":\"true\"") {
            Ok(())
        } else {
            Err(format!(
                "unhealthy: {}",
                text.lines().last().unwrap_or_default()
            ))
        }
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .map_err(|_| "health check timed out".to_string())?
}

/// What every kube-apiserver of the test bed shares: the binaries, the state directory, the
/// PKI, the one etcd, the options.
struct Shared<'a> {
    assets: &'a Assets,
    dir: &'a Path,
    pki: &'a Pki,
    etcd_url: &'a str,
    opts: &'a FleetOptions,
}

/// A hosted cluster's kube-apiserver: a real hosted cluster's authorization and admission
/// where it has a data plane, and the static guards' files from 1.36.
fn new_hosted_apiserver(name: &str, shared: &Shared<'_>) -> Result<ApiServer, LocalCpError> {
    let mut s = new_apiserver(name, &format!("/registry-hosted-{name}"), None, shared)?;
    if shared.opts.data_plane {
        as_a_hosted_cluster(&mut s.args);
    }
    if shared
        .assets
        .version
        .serves(assets::Feature::StaticManifests)
    {
        let (config, root) = static_volumes::prepare(&shared.dir.join(name))
            .map_err(io(format!("preparing {name}'s static guards")))?;
        s.args
            .push("--feature-gates=ManifestBasedAdmissionControlConfig=true".into());
        s.args.push(format!(
            "--admission-control-config-file={}",
            config.display()
        ));
        s.static_dir = Some(root);
    }
    Ok(s)
}

fn new_apiserver(
    name: &str,
    etcd_prefix: &str,
    port: Option<u16>,
    shared: &Shared<'_>,
) -> Result<ApiServer, LocalCpError> {
    let Shared {
        assets,
        dir,
        pki,
        etcd_url,
        opts,
    } = *shared;
    let port = match port {
        Some(p) => p,
        None => free_port()?,
    };
    let sdir = dir.join(name);
    std::fs::create_dir_all(&sdir).map_err(io(format!("creating {}", sdir.display())))?;
    let serving = pki.serving_pair(&sdir, name)?;
    let mut args: Vec<String> = vec![
        format!("--etcd-servers={etcd_url}"),
        format!("--etcd-prefix={etcd_prefix}"),
        format!("--secure-port={port}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--cert-dir={}", sdir.display()),
        format!("--tls-cert-file={}", serving.0.display()),
        format!("--tls-private-key-file={}", serving.1.display()),
        format!("--client-ca-file={}", pki.ca_path.display()),
        // Room for a Service per HCP of the scale benchmark (a /24 runs out at 254).
        "--service-cluster-ip-range=10.0.0.0/16".into(),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        format!("--service-account-key-file={}", pki.sa_pub_path.display()),
        format!(
            "--service-account-signing-key-file={}",
            pki.sa_key_path.display()
        ),
        "--authorization-mode=RBAC".into(),
        // No controller-manager or kubelet here: admission plugins that expect them only get
        // in the way (ServiceAccount would demand token secrets no one creates).
        "--disable-admission-plugins=ServiceAccount".into(),
        "--allow-privileged=true".into(),
        // At --v=1 and above the flag dump buries the one line that says why start-up failed.
        "--v=0".into(),
    ];
    if assets.version.has_insecure_port_flag() {
        // Off where the flag exists (before 1.24 it defaulted to an open local port).
        args.push("--insecure-port=0".into());
    }
    args.extend(assets.version.removed_betas());
    args.extend(opts.extra_apiserver_args.iter().cloned());
    let kubeconfig_yaml = pki.admin_kubeconfig(name, &format!("https://127.0.0.1:{port}"))?;
    let kubeconfig_path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&kubeconfig_path, &kubeconfig_yaml)
        .map_err(io(format!("writing {}", kubeconfig_path.display())))?;
    Ok(ApiServer {
        name: name.to_string(),
        port,
        kubeconfig_path,
        kubeconfig_yaml,
        args,
        binary: assets.kube_apiserver.clone(),
        log_path: dir.join(format!("{name}.log")),
        process: None,
        timeout: opts.startup_timeout,
        static_dir: None,
    })
}

async fn wait_apiserver_ready(
    proc: &mut ManagedProcess,
    client: &Client,
    timeout: Duration,
) -> Result<(), LocalCpError> {
    let deadline = Instant::now() + timeout;
    let mut last_error: String;
    loop {
        if let Some(status) = proc.exited() {
            return Err(LocalCpError::Exited {
                component: format!("kube-apiserver {}", proc.component()),
                status,
                log_tail: proc.log_tail(20),
            });
        }
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| LocalCpError::Kubeconfig {
                component: proc.component().to_string(),
                reason: e.to_string(),
            })?;
        match tokio::time::timeout(Duration::from_secs(3), client.request_text(req)).await {
            Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
            Ok(Ok(body)) => last_error = format!("readyz said {body:?}"),
            Ok(Err(e)) => last_error = e.to_string(),
            Err(_) => last_error = "readyz timed out".into(),
        }
        if Instant::now() > deadline {
            return Err(LocalCpError::NotReady {
                component: format!("kube-apiserver {}", proc.component()),
                timeout,
                last_error,
                log_tail: proc.log_tail(20),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client from a kubeconfig held in memory.
pub async fn client_from_kubeconfig(component: &str, yaml: &str) -> Result<Client, LocalCpError> {
    let kc = Kubeconfig::from_yaml(yaml).map_err(|e| LocalCpError::Kubeconfig {
        component: component.to_string(),
        reason: e.to_string(),
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| LocalCpError::Kubeconfig {
            component: component.to_string(),
            reason: e.to_string(),
        })?;
    Client::try_from(config).map_err(|source| LocalCpError::Kube {
        context: format!("building a client for {component}"),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let (lo, hi) = ephemeral_range();
        assert!(lo <= hi, "{lo}..{hi}");
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a port")).collect();
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for p in &ports {
            assert!(!(lo..=hi).contains(p), "{p} is ephemeral ({lo}..{hi})");
            TcpListener::bind(("127.0.0.1", *p)).expect("free");
        }
    }
}
