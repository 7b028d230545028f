//! Helpers shared by the e2e tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use hcp_fleet_agent::localcp::{Assets, LocalCpError};

/// The test bed binaries. `make test` provides them; a bare `cargo test` finds the cache.
pub fn assets_or_skip_reason() -> Result<Assets, LocalCpError> {
    Assets::resolve(None)
}

/// PIDs of live processes whose command line mentions `path`.
pub fn processes_mentioning(path: &Path) -> Vec<u32> {
    let needle = path.as_os_str().as_encoded_bytes().to_vec();
    let me = std::process::id();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmdline
            .windows(needle.len())
            .any(|w| w == needle.as_slice())
            && !is_zombie(pid)
        {
            found.push(pid);
        }
    }
    found
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(false)
}

/// True once `pid` no longer exists (or is a zombie awaiting its parent).
pub fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let alive = Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid);
        if !alive {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain HTTP/1.0 GET on loopback; returns (status code, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Polls `check` until it succeeds or `within` passes; panics with the last reason.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    let mut last = String::from("never checked");
    while Instant::now() < deadline {
        match check().await {
            Ok(()) => return,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what} not reached within {within:?}: {last}");
}

/// A TCP relay that can be cut: the network between one process and its API server. Cut, it
/// forwards nothing and answers nothing (a black hole, not a refusal), as a partition does;
/// healed, it drops what it held and forwards new connections again.
pub struct Relay {
    pub addr: std::net::SocketAddr,
    state: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(upstream: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let (state, _) = tokio::sync::watch::channel(false);
        let st = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut a, _)) = listener.accept().await {
                let mut rx = st.subscribe();
                tokio::spawn(async move {
                    if !*rx.borrow() {
                        let Ok(mut b) = tokio::net::TcpStream::connect(upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut a, &mut b) => return,
                            _ = rx.wait_for(|cut| *cut) => {}
                        }
                    }
                    // Cut: hold the connection silent until healed, then drop it.
                    let _ = rx.wait_for(|cut| !*cut).await;
                });
            }
        });
        Relay { addr, state, task }
    }

    pub fn cut(&self) {
        self.state.send_replace(true);
    }

    pub fn heal(&self) {
        self.state.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.heal();
        self.task.abort();
    }
}

/// A child process killed and reaped when the test ends, panicking or not: a spawned agent
/// must not outlive a failed assertion (it would hold the test's output pipe open too).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stand-in kubelet running the real `webhook` command for each admission Deployment.
pub fn real_pods(dir: &std::path::Path) -> hcp_fleet_agent::localcp::kubelet::KubeletOptions {
    hcp_fleet_agent::localcp::kubelet::KubeletOptions {
        binary: Some(env!("CARGO_BIN_EXE_hcp-fleet-agent").into()),
        dir: dir.to_path_buf(),
    }
}

/// The stand-in kubelet and the directory of its pods, kept for the test's length.
pub struct Pods {
    _dir: tempfile::TempDir,
    _kubelet: tokio::task::JoinHandle<()>,
}

/// A fleet of `n` hosted clusters whose admission Deployments run as real `webhook` processes,
/// with an admin client for the management cluster.
pub async fn fleet_with_pods(
    n: usize,
) -> (hcp_fleet_agent::localcp::LocalFleet, kube::Client, Pods) {
    let fleet = hcp_fleet_agent::localcp::LocalFleet::start(
        hcp_fleet_agent::localcp::FleetOptions::with_hosted(n),
    )
    .await
    .expect("fleet");
    let mgmt = fleet.management.client().await.expect("mgmt");
    let dir = tempfile::tempdir().expect("tmp");
    let kubelet = hcp_fleet_agent::localcp::kubelet::spawn(mgmt.clone(), real_pods(dir.path()));
    (
        fleet,
        mgmt,
        Pods {
            _dir: dir,
            _kubelet: kubelet,
        },
    )
}

/// An agent process with leader election, as the chart runs it (in local mode for the test
/// bed), as `name` (POD_NAME), with its metrics on a free loopback port. `lease_seconds`
/// `None` keeps the agent's default.
pub fn spawn_elected_agent(
    name: &str,
    kubeconfig: &Path,
    namespace: &str,
    lease_seconds: Option<u64>,
) -> (KillOnDrop, std::net::SocketAddr) {
    let port = hcp_fleet_agent::localcp::free_port().expect("port");
    // The test bed's configuration, beside the kubeconfig (which outlives the agent).
    let config = kubeconfig.with_file_name(format!("agent-{name}-{port}.yaml"));
    std::fs::write(&config, hcp_fleet_agent::localcp::agent_config_yaml()).expect("config");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hcp-fleet-agent"));
    cmd.args(["agent", "--local-mode", "--leader-elect"])
        .arg("--config")
        .arg(&config)
        .args(["--namespace", namespace])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", name)
        .env("RUST_LOG", "warn");
    if let Some(s) = lease_seconds {
        cmd.args(["--lease-duration-seconds", &s.to_string()]);
    }
    let child = cmd.spawn().expect("agent process");
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    (KillOnDrop(child), addr)
}
