//! `make bench` (admission part): the real `webhook` process under load over TLS keep-alive,
//! against a baseline (the same binary and server stack answering a fixed AdmissionResponse).
//! For concurrency 1, 16 and 64 it prints requests per second, client-side latency percentiles
//! (exact, including TLS and the loopback hop) and server-side percentiles from the service's
//! own histogram (bucket upper bounds), the server's CPU per review and the load generator's
//! (this process's), and the throughput ratio to the baseline: the median of
//! BENCH_ADMISSION_ROUNDS rounds (default 3), each measuring both servers back to back at each
//! concurrency.
//!
//! The load generator is in this file: one HTTP/1.1 keep-alive connection per concurrent
//! client, each sending its next request when the previous answer arrives (closed loop).
//! Environment: BENCH_SECONDS per run (default 5).
//!
//! Then the same rounds server-bound: each server alone on one CPU (taskset), the load
//! generator on the others, 64 connections, where the ratio is what a review costs the
//! service against the fixed response, steady from round to round (skipped on one CPU). It
//! also prints that cost as the ratio of the two servers' CPU per review, and says so when a
//! server was not the bottleneck in every run (below 97 % of its CPU: the load generator held
//! it back, which flatters the rates' ratio).
//!
//! Then wrk (Debian's) against the service and a Go standard-library server shaped like it
//! (`e2e/anchor/main.go`), at 1, 16 and 64 connections for BENCH_WRK_SECONDS (default 10): the
//! anchor the issue's target is set against. `make bench` installs both through
//! `hack/bench-tools.sh`; without them this part says it is skipped.

// An e2e scenario reads as one story, set up, acted and checked in order: the 100-line and
// seven-argument limits hold the shipped code in src/ (clippy.toml).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)]

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hcp_fleet_render::certificates;
use hcp_fleet_render::certificates::Usage;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

fn review_body() -> Vec<u8> {
    // A realistic denial: a regular user deleting a protected ClusterRole.
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole"},
            "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": "clusterroles"},
            "requestKind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole"},
            "requestResource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": "clusterroles"},
            "name": "cluster-admin",
            "operation": "DELETE",
            "userInfo": {"username": "alice", "uid": "1", "groups": ["system:authenticated"]},
            "oldObject": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"},
            "dryRun": false
        }
    }))
    .unwrap_or_default()
}

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_on(dir: &Path, baseline: bool, port: u16) -> Result<Server, String> {
    start_spinning(dir, baseline, port, None, None)
}

/// The server with `--spin-micros` set (`None`: its default), held to the CPUs `pinned`
/// names (taskset's list; `None`: any), which it counts for its connection threads.
fn start_spinning(
    dir: &Path,
    baseline: bool,
    port: u16,
    spin_micros: Option<u64>,
    pinned: Option<&str>,
) -> Result<Server, String> {
    let bin = env!("CARGO_BIN_EXE_hcp-fleet-dev");
    // taskset execs the server, so the child's pid is the server's.
    let mut cmd = match pinned {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpus, bin]);
            c
        }
        None => Command::new(bin),
    };
    if let Some(us) = spin_micros {
        cmd.env("HCP_FLEET_SPIN_MICROS", us.to_string());
    }
    cmd.args([
        if baseline {
            "webhook-baseline"
        } else {
            "webhook"
        },
        "--bind",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--cert-dir",
    ])
    .arg(dir)
    // wrk names the server by its IP address in SNI, which rustls notes at every handshake.
    .env("RUST_LOG", "warn,rustls=error")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    let child = cmd.spawn().map_err(|e| e.to_string())?;
    Ok(Server { child, port })
}

async fn wait_ready(port: u16, ca: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while hcp_fleet_testbed::kubelet::https_get(port, ca, "/readyz")
        .await
        .map(|r| r.0)
        != Ok(200)
    {
        if Instant::now() > deadline {
            return Err("server not ready".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A keep-alive HTTP/1.1 connection over TLS to `port`, its connection task spawned (an error
/// that ends it reaches the next request on it).
async fn connect(
    port: u16,
    tls: tokio_rustls::TlsConnector,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let stream = tls.connect(name, tcp).await.map_err(|e| e.to_string())?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(send)
}

/// One closed-loop client on one keep-alive connection; returns its latencies.
async fn client(
    port: u16,
    tls: tokio_rustls::TlsConnector,
    body: Bytes,
    until: Instant,
) -> Result<Vec<Duration>, String> {
    let mut send = connect(port, tls).await?;
    let mut lat = Vec::with_capacity(16_384);
    while Instant::now() < until {
        let req = hyper::Request::post("/validate/protected-rbac")
            .header("content-type", "application/json")
            .header("host", "127.0.0.1")
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())?;
        send.ready()
            .await
            .map_err(|e| format!("connection not ready: {e}"))?;
        let t0 = Instant::now();
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        if resp.status() != 200 {
            return Err(format!("status {}", resp.status()));
        }
        let _ = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        lat.push(t0.elapsed());
    }
    Ok(lat)
}

/// A keep-alive connection to `port` that has carried one review, held open.
async fn opened(
    port: u16,
    tls: tokio_rustls::TlsConnector,
    body: Bytes,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
    let mut send = connect(port, tls).await?;
    post(&mut send, body).await?;
    Ok(send)
}

async fn post(
    send: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    body: Bytes,
) -> Result<(), String> {
    let req = hyper::Request::post("/validate/protected-rbac")
        .header("content-type", "application/json")
        .header("host", "127.0.0.1")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    send.ready().await.map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    resp.into_body()
        .collect()
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The server's CPU (% of one core) over `secs`: at rest after 16 keep-alive connections each
/// carried a review (the service closes an HTTP/1.1 connection quiet for 5 s), then with one
/// review every 20 ms on a connection of its own (a kube-apiserver at a low rate: too slow for
/// a spin to catch).
async fn at_rest(server: &Server, ca: &str, secs: u64) -> Result<(f64, f64), String> {
    let tls = hcp_fleet_testbed::kubelet::tls_connector(ca)?;
    let body = Bytes::from(review_body());
    let mut conns = Vec::new();
    for _ in 0..16 {
        conns.push(opened(server.port, tls.clone(), body.clone()).await?);
    }
    let pid = server.child.id();
    let busy_since = |t0: u64, started: Instant| {
        support::core_percent(
            support::cpu_ticks(pid).saturating_sub(t0),
            started.elapsed(),
        )
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (t0, started) = (support::cpu_ticks(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let rest = busy_since(t0, started);
    let (t0, started) = (support::cpu_ticks(pid), Instant::now());
    drop(conns);
    let mut every = tokio::time::interval(Duration::from_millis(20));
    let until = started + Duration::from_secs(secs);
    let mut one = opened(server.port, tls, body.clone()).await?;
    while Instant::now() < until {
        every.tick().await;
        post(&mut one, body.clone()).await?;
    }
    let trickle = busy_since(t0, started);
    Ok((rest, trickle))
}

/// Server-side percentile (bucket upper bound, seconds) from a histogram delta.
fn server_quantiles(before: &str, after: &str, webhook: &str, qs: &[f64]) -> Vec<f64> {
    let buckets = |text: &str| -> BTreeMap<u64, f64> {
        let mut m = BTreeMap::new();
        for l in text.lines().filter(|l| {
            l.starts_with("hcp_fleet_admission_request_duration_seconds_bucket{")
                && l.contains(&format!("webhook=\"{webhook}\""))
        }) {
            let le = l
                .split("le=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("+Inf");
            let le: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            let v: f64 = l
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            m.insert(le.to_bits(), v);
        }
        m
    };
    let (b0, b1) = (buckets(before), buckets(after));
    let mut rows: Vec<(f64, f64)> = b1
        .iter()
        .map(|(k, v)| (f64::from_bits(*k), v - b0.get(k).copied().unwrap_or(0.0)))
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = rows.last().map(|r| r.1).unwrap_or(0.0);
    qs.iter()
        .map(|q| {
            rows.iter()
                .find(|(_, c)| *c >= q * total)
                .map(|(le, _)| *le)
                .unwrap_or(f64::NAN)
        })
        .collect()
}

async fn metrics(port: u16, ca: &str) -> String {
    hcp_fleet_testbed::kubelet::https_get(port, ca, "/metrics")
        .await
        .map(|r| r.1)
        .unwrap_or_default()
}

struct Row {
    rps: f64,
    /// The server's CPU per review over the measured window, µs (read in ticks of 10 ms).
    cpu_per_review: f64,
    /// The load generator's (this process's) CPU per review over the same window, µs.
    gen_per_review: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    srv: Vec<f64>,
}

impl Row {
    /// The share of its CPU the server kept busy (1.0: the server set the rate).
    fn server_busy(&self) -> f64 {
        self.rps * self.cpu_per_review / 1e6
    }
}

async fn run_one(
    port: u16,
    pid: u32,
    ca: &str,
    webhook: &str,
    conc: usize,
    secs: u64,
) -> Result<Row, String> {
    let tls = hcp_fleet_testbed::kubelet::tls_connector(ca)?;
    let body = Bytes::from(review_body());
    // Warm-up: connections, TLS sessions, allocator.
    let warm = Instant::now() + Duration::from_millis(500);
    client(port, tls.clone(), body.clone(), warm).await?;
    let m0 = metrics(port, ca).await;
    let until = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let (ticks, gen_ticks) = (
        support::cpu_ticks(pid),
        support::cpu_ticks(std::process::id()),
    );
    let tasks: Vec<_> = (0..conc)
        .map(|_| tokio::spawn(client(port, tls.clone(), body.clone(), until)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = support::cpu_ticks(pid).saturating_sub(ticks);
    let gen_cpu = support::cpu_ticks(std::process::id()).saturating_sub(gen_ticks);
    let m1 = metrics(port, ca).await;
    all.sort();
    Ok(Row {
        rps: all.len() as f64 / elapsed,
        cpu_per_review: support::cpu_seconds(cpu) * 1e6 / all.len().max(1) as f64,
        gen_per_review: support::cpu_seconds(gen_cpu) * 1e6 / all.len().max(1) as f64,
        p50: support::percentile_ms(&all, 50.0),
        p99: support::percentile_ms(&all, 99.0),
        p999: support::percentile_ms(&all, 99.9),
        srv: server_quantiles(&m0, &m1, webhook, &[0.5, 0.99, 0.999]),
    })
}

/// The body of one answer to `body` on the protected-RBAC path, over a fresh connection.
async fn answer(port: u16, ca: &str, body: Bytes) -> Result<String, String> {
    let tls = hcp_fleet_testbed::kubelet::tls_connector(ca)?;
    let mut send = connect(port, tls).await?;
    let req = hyper::Request::post("/validate/protected-rbac")
        .header("content-type", "application/json")
        .header("host", "127.0.0.1")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// What one wrk run measured.
struct WrkRow {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
}

/// The two servers the rounds measure, ready, held to `pinned`'s CPUs (`None`: any): the
/// service and the baseline, each with its name and the webhook its histogram counts under.
async fn the_two(
    dir: &Path,
    ca: &str,
    pinned: Option<&str>,
) -> Result<[(&'static str, Server, &'static str); 2], String> {
    let port = || hcp_fleet_testbed::free_port().map_err(|e| e.to_string());
    let servers = [
        (
            "service",
            start_spinning(dir, false, port()?, None, pinned)?,
            "protected-rbac.hcp-fleet.openshift.io",
        ),
        (
            "baseline",
            start_spinning(dir, true, port()?, None, pinned)?,
            "baseline",
        ),
    ];
    for (_, server, _) in &servers {
        wait_ready(server.port, ca).await?;
    }
    Ok(servers)
}

/// The service's rate over the baseline's, round by round (each run's row): the rounds'
/// median ratio, their range, each server's median CPU per review, and the load generator's
/// against each. The generator's share says why the ratio on shared cores is not the
/// servers' alone: the slower server costs the generator more per review (fuller answers,
/// fewer of them ready at each wake-up), and the cores are not all busy.
fn ratio_of_rounds(svc: &[Row], base: &[Row]) -> String {
    let mut ratios: Vec<f64> = svc.iter().zip(base).map(|(s, b)| s.rps / b.rps).collect();
    ratios.sort_by(f64::total_cmp);
    let busy = |r: &Row| r.rps * (r.cpu_per_review + r.gen_per_review) / 1e6;
    format!(
        "{:.2} (median of {} rounds, {:.2} to {:.2}); CPU per review {:.2} µs against {:.2} µs, \
         the load generator's {:.2} against {:.2} µs; cores busy (both) {:.2} against {:.2}",
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN),
        ratios.len(),
        ratios.first().copied().unwrap_or(f64::NAN),
        ratios.last().copied().unwrap_or(f64::NAN),
        median_of(svc, |r| r.cpu_per_review),
        median_of(base, |r| r.cpu_per_review),
        median_of(svc, |r| r.gen_per_review),
        median_of(base, |r| r.gen_per_review),
        median_of(svc, busy),
        median_of(base, busy),
    )
}

/// The median over the runs of one figure of each.
fn median_of(runs: &[Row], f: fn(&Row) -> f64) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// This process's CPUs, as taskset lists them ("0-3", "0,2"), or why not.
fn affinity() -> Result<String, String> {
    let out = Command::new("taskset")
        .args(["-c", "-p", &std::process::id().to_string()])
        .output()
        .map_err(|e| format!("taskset: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.rsplit_once(": ")
        .map(|(_, list)| list.trim().to_string())
        .filter(|l| out.status.success() && !l.is_empty())
        .ok_or_else(|| format!("taskset -c -p: {text}"))
}

/// The CPUs of a taskset list, one by one ("0-2,5": 0, 1, 2, 5).
fn cpus_of(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
            cpus.extend(a..=b);
        }
    }
    cpus
}

/// Every thread of this process held to `cpus` while this lives (threads started later
/// inherit it), then given back `was`.
struct Pinned {
    was: String,
}

impl Pinned {
    fn to(cpus: &str, was: String) -> Result<Pinned, String> {
        let status = Command::new("taskset")
            .args(["-a", "-c", "-p", cpus, &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("taskset: {e}"))?;
        if !status.success() {
            return Err(format!("taskset -a -c -p {cpus}: {status}"));
        }
        Ok(Pinned { was })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = Command::new("taskset")
            .args(["-a", "-c", "-p", &self.was, &std::process::id().to_string()])
            .stdout(Stdio::null())
            .status();
    }
}

/// The rates above, at 16 and 64 connections, are the two cores' CPU shared between the
/// load generator and the server, and the scheduler's mixing of their threads: a round
/// varies by a tenth. Here each server has a CPU of its own (so one connection thread) and
/// the load generator the others, 64 connections: the server is the bottleneck, and the
/// ratio is what a review costs the service against the same TLS stack answering a fixed
/// response, steady to about a hundredth from round to round.
async fn server_bound(dir: &Path, ca: &str, secs: u64, rounds: u64) -> Result<(), String> {
    println!();
    let was = match affinity() {
        Ok(list) => list,
        Err(e) => {
            println!("server-bound: skipped ({e})");
            return Ok(());
        }
    };
    let cpus = cpus_of(&was);
    let Some((server_cpu, others)) = cpus.split_first().filter(|(_, o)| !o.is_empty()) else {
        println!("server-bound: skipped (one CPU: {was})");
        return Ok(());
    };
    let others: Vec<String> = others.iter().map(ToString::to_string).collect();
    let server_cpu = server_cpu.to_string();
    println!(
        "server-bound, 64 connections, {secs}s per run: each server alone on CPU {server_cpu}, the load generator on {}",
        others.join(",")
    );
    let servers = the_two(dir, ca, Some(&server_cpu)).await?;
    let _pinned = match Pinned::to(&others.join(","), was) {
        Ok(pinned) => pinned,
        Err(e) => {
            println!("server-bound: skipped ({e})");
            return Ok(());
        }
    };
    // Each round's run, by server.
    let mut runs: [Vec<Row>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (name, server, webhook) = &servers[i];
            let r = run_one(server.port, server.child.id(), ca, webhook, 64, secs).await?;
            println!(
                "{:<9} {:>9.0} req/s, CPU per review {:>5.2} µs, server busy {:>3.0} % of its CPU, load generator {:>5.2} µs  {}",
                name,
                r.rps,
                r.cpu_per_review,
                r.server_busy() * 100.0,
                r.gen_per_review,
                round + 1
            );
            runs[i].push(r);
        }
    }
    let [svc, base] = &runs;
    println!(
        "server-bound ratio service/baseline at 64: {}",
        ratio_of_rounds(svc, base)
    );
    // The rate's ratio is what a review costs each server only while both are the bottleneck.
    // On a slower machine the one load generator thread can hold the faster server back
    // (seen: the baseline 89 to 95 % busy), which flatters the ratio; the CPU per review
    // still says what a review costs.
    let cpu = |r: &Row| r.cpu_per_review;
    let least = |runs: &[Row]| {
        runs.iter()
            .map(Row::server_busy)
            .fold(f64::INFINITY, f64::min)
    };
    println!(
        "  what a review costs, the baseline's CPU per review over the service's: {:.2}",
        median_of(base, cpu) / median_of(svc, cpu)
    );
    let (s, b) = (least(svc), least(base));
    if s.min(b) < SERVER_BOUND {
        println!(
            "  not server-bound in every run (the least busy: the service {:.0} %, the baseline {:.0} % of its CPU): \
             a server below {:.0} % waited on the load generator, so the rates' ratio says less than the line above",
            s * 100.0,
            b * 100.0,
            SERVER_BOUND * 100.0
        );
    }
    Ok(())
}

/// The share of its CPU a server keeps busy when it, not the load generator, sets the rate.
const SERVER_BOUND: f64 = 0.97;

/// wrk's duration ("91.00us", "1.20ms", "1.01s") in microseconds.
fn wrk_micros(v: &str) -> Option<f64> {
    let (n, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    n.parse::<f64>().ok().map(|n| n * scale)
}

/// wrk (one thread, `conns` keep-alive connections, `secs` seconds) against `port`, posting
/// the review: requests per second and its latency percentiles. Any answer but 2xx fails it.
fn run_wrk(
    wrk: &Path,
    script: &Path,
    port: u16,
    conns: usize,
    secs: u64,
) -> Result<WrkRow, String> {
    let out = Command::new(wrk)
        .args([
            "-t1",
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--latency",
            "-s",
        ])
        .arg(script)
        .arg(format!("https://127.0.0.1:{port}/validate/protected-rbac"))
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || text.contains("Non-2xx") || text.contains("Socket errors") {
        return Err(format!(
            "wrk on port {port} with {conns} connection(s):\n{text}"
        ));
    }
    let field = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix))
            .map(|r| r.trim().to_string())
    };
    let rps = field("Requests/sec:").and_then(|v| v.parse().ok());
    let p50 = field("50%").and_then(|v| wrk_micros(&v));
    let p99 = field("99%").and_then(|v| wrk_micros(&v));
    match (rps, p50, p99) {
        (Some(rps), Some(p50_us), Some(p99_us)) => Ok(WrkRow {
            rps,
            p50_us,
            p99_us,
        }),
        _ => Err(format!("wrk's output not understood:\n{text}")),
    }
}

/// The same review through wrk against the admission service and the Go anchor
/// (`e2e/anchor/main.go`), one connection first: the shape a kube-apiserver calls a webhook in.
async fn against_go(dir: &Path, ca: &str, secs: u64) -> Result<(), String> {
    let (Ok(wrk), Ok(anchor)) = (std::env::var("BENCH_WRK"), std::env::var("BENCH_ANCHOR")) else {
        println!(
            "wrk and the Go anchor: skipped (BENCH_WRK and BENCH_ANCHOR unset; `make bench` sets them through hack/bench-tools.sh)"
        );
        return Ok(());
    };
    let body = String::from_utf8(review_body()).map_err(|e| e.to_string())?;
    let script = dir.join("post.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = [==[{body}]==]\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let go_version = Command::new("go")
        .args(["env", "GOVERSION"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!();
    println!(
        "wrk (1 thread) against the service and a Go {go_version} standard-library server shaped like it (e2e/anchor/main.go), {secs}s per run, the same review and certificate:"
    );
    println!(
        "{:<9} {:>5} {:>10} {:>9} {:>9}",
        "target", "conns", "req/s", "p50 µs", "p99 µs"
    );
    let mut rows: BTreeMap<usize, (Option<WrkRow>, Option<WrkRow>)> = BTreeMap::new();
    for (name, go) in [("service", false), ("go", true)] {
        let port = hcp_fleet_testbed::free_port().map_err(|e| e.to_string())?;
        let server = if go {
            // Its log is one line per connection closed before a handshake (the readiness
            // checks), nothing the benchmark reads.
            let child = Command::new(&anchor)
                .arg(dir)
                .arg(port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("{anchor}: {e}"))?;
            Server { child, port }
        } else {
            start_on(dir, false, port)?
        };
        wait_ready(server.port, ca).await?;
        let said = answer(server.port, ca, Bytes::from(review_body())).await?;
        if !said.contains("\"allowed\":false") || !said.contains("protected ClusterRole") {
            return Err(format!("{name} did not deny the review: {said}"));
        }
        for conns in [1usize, 16, 64] {
            let r = run_wrk(Path::new(&wrk), &script, server.port, conns, secs)?;
            println!(
                "{:<9} {:>5} {:>10.0} {:>9.0} {:>9.0}",
                name, conns, r.rps, r.p50_us, r.p99_us
            );
            let e = rows.entry(conns).or_insert((None, None));
            if go { e.1 = Some(r) } else { e.0 = Some(r) }
        }
    }
    for (conns, pair) in rows {
        if let (Some(svc), Some(go)) = pair {
            let target = if conns == 1 {
                "   target >= 1.30, p50 below Go's"
            } else {
                "   target > 1.00"
            };
            println!(
                "service/go at {conns:>2} connection(s): {:.2}x requests/s, p50 {:.2}x, p99 {:.2}x{target}",
                svc.rps / go.rps,
                svc.p50_us / go.p50_us,
                svc.p99_us / go.p99_us,
            );
        }
    }
    Ok(())
}

fn main() {
    support::bench_main(Some(1), run);
}

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn run() -> Result<(), String> {
    let secs: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ca = certificates::generate_ca("bench CA", time::Duration::days(1))
        .map_err(|e| e.to_string())?;
    let srv = certificates::issue(
        &ca,
        "127.0.0.1",
        &Usage::Server {
            sans: vec!["127.0.0.1".into()],
        },
        time::Duration::days(1),
    )
    .map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("tls.crt"), &srv.cert_pem).map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("tls.key"), &srv.key_pem).map_err(|e| e.to_string())?;

    println!(
        "admission benchmark: {secs}s per run, closed-loop HTTP/1.1 keep-alive over TLS on loopback,"
    );
    println!(
        "load generator (1 thread) and server on the same 2 cores; body {} bytes (a protected-ClusterRole denial)",
        review_body().len()
    );
    println!(
        "{:<9} {:>4} {:>9} {:>9} {:>9} {:>9}   {:>11} {:>11} {:>11} {:>8} {:>8}  round",
        "target",
        "conc",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "srv p50 ≤ms",
        "srv p99 ≤ms",
        "srv p99.9≤ms",
        "CPU µs",
        "gen µs",
    );
    // Both servers up at once, the one not measured at rest; each round measures them back to
    // back at each concurrency, in turns (the service first in even rounds), so a drift of the
    // machine's speed falls on both alike. One run's ratio at 16 or 64 connections varies by a
    // tenth on two shared cores; the median of the rounds is the figure.
    let rounds = env_secs("BENCH_ADMISSION_ROUNDS", 3).max(1);
    let servers = the_two(dir.path(), &ca.cert_pem, None).await?;
    // Each round's run, by concurrency and server.
    let mut by_conc: BTreeMap<usize, [Vec<Row>; 2]> = BTreeMap::new();
    for round in 0..rounds {
        for conc in [1usize, 16, 64] {
            let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let (name, server, webhook) = &servers[i];
                let r = run_one(
                    server.port,
                    server.child.id(),
                    &ca.cert_pem,
                    webhook,
                    conc,
                    secs,
                )
                .await?;
                println!(
                    "{:<9} {:>4} {:>9.0} {:>9.3} {:>9.3} {:>9.3}   {:>11.3} {:>11.3} {:>11.3} {:>8.2} {:>8.2}  {}",
                    name,
                    conc,
                    r.rps,
                    r.p50,
                    r.p99,
                    r.p999,
                    r.srv[0] * 1000.0,
                    r.srv[1] * 1000.0,
                    r.srv[2] * 1000.0,
                    r.cpu_per_review,
                    r.gen_per_review,
                    round + 1
                );
                by_conc.entry(conc).or_default()[i].push(r);
            }
        }
    }
    drop(servers);
    println!();
    for (conc, [svc, base]) in by_conc {
        println!(
            "ratio service/baseline at concurrency {conc:>2}: {}",
            ratio_of_rounds(&svc, &base)
        );
    }
    server_bound(dir.path(), &ca.cert_pem, secs, rounds).await?;
    // What the spin costs where it cannot pay: nothing at rest, and at a low rate.
    let rest_secs = env_secs("BENCH_REST_SECONDS", 10);
    println!();
    println!(
        "the service's CPU, {rest_secs}s each: at rest with 16 keep-alive connections open, then one review every 20 ms"
    );
    for (label, spin) in [("spin (default)", None), ("spin off (0)", Some(0))] {
        let port = hcp_fleet_testbed::free_port().map_err(|e| e.to_string())?;
        let server = start_spinning(dir.path(), false, port, spin, None)?;
        wait_ready(server.port, &ca.cert_pem).await?;
        let (rest, trickle) = at_rest(&server, &ca.cert_pem, rest_secs).await?;
        println!("  {label:<16} at rest {rest:.2} % of a core, at 50 reviews/s {trickle:.2} %");
    }
    against_go(dir.path(), &ca.cert_pem, env_secs("BENCH_WRK_SECONDS", 10)).await?;
    let _ = support::processes_mentioning(dir.path());
    Ok(())
}
