//! The admission service alone: connection limits, idle connections, malformed requests, every guard's cases over TLS.

use super::*;

/// POST over TLS to the service; returns (status, body).
pub(crate) async fn https_post(
    port: u16,
    ca_pem: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Result<(u16, String), String> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    kubelet::https_request(port, ca_pem, &head, body).await
}

/// A directory holding `tls.crt` and `tls.key` for 127.0.0.1, issued by a new CA named
/// `ca_name` (returned, for the client's trust).
pub(crate) fn loopback_serving_files(ca_name: &str) -> (KeyedCert, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tmp");
    let (ca, srv) = support::loopback_serving_pair(ca_name);
    std::fs::write(dir.path().join("tls.crt"), &srv.cert_pem).expect("crt");
    std::fs::write(dir.path().join("tls.key"), &srv.key_pem).expect("key");
    (ca, dir)
}

/// The admission service on its own, as its container runs it, with the default settings:
/// (the process, its port, the CA its certificate is signed by, the directory of its files).
pub(crate) async fn standalone_service() -> (std::process::Child, u16, String, tempfile::TempDir) {
    standalone_service_with(&[]).await
}

/// `standalone_service`, with more arguments.
pub(crate) async fn standalone_service_with(
    extra: &[&str],
) -> (std::process::Child, u16, String, tempfile::TempDir) {
    hcp_fleet_guards::crypto::install_provider();
    let (ca, dir) = loopback_serving_files("t");
    let port = hcp_fleet_testbed::free_port().expect("port");
    let child = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .args([
            "webhook",
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--cert-dir",
        ])
        .arg(dir.path())
        .args(extra)
        .spawn()
        .expect("webhook");
    eventually("webhook ready", Duration::from_secs(10), || {
        let ca = ca.cert_pem.clone();
        async move {
            match kubelet::https_get(port, &ca, "/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    (child, port, ca.cert_pem, dir)
}

/// A flood of connections cannot hold the service: past `--max-connections` a new connection
/// is closed at once, and one that never finishes its TLS handshake frees its slot after the
/// handshake timeout (5 s).
#[tokio::test]
async fn connections_beyond_the_limit_are_closed_at_once() {
    use tokio::io::AsyncReadExt;
    let (mut child, port, ca_pem, _dir) =
        standalone_service_with(&["--max-connections", "3"]).await;
    // Three connections that say nothing hold the three slots. The readiness checks before
    // hold slots of their own until the service has seen them close, which on a loaded
    // machine can come after the first of these arrive (and are turned away): the three
    // are made again until all three are seen held (open, unanswered).
    let mut held = Vec::new();
    for attempt in 0.. {
        held.clear();
        for _ in 0..3 {
            held.push(
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .expect("connect"),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut open = 0;
        for c in &mut held {
            let mut b = [0u8; 1];
            if tokio::time::timeout(Duration::from_millis(100), c.read(&mut b))
                .await
                .is_err()
            {
                open += 1;
            }
        }
        if open == 3 {
            break;
        }
        assert!(attempt < 20, "three connections never held the three slots");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A fourth is closed at once: its read ends with nothing.
    let mut extra = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(2), extra.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "a connection past the limit is closed at once: {read:?}"
    );
    assert!(kubelet::https_get(port, &ca_pem, "/readyz").await.is_err());
    // The silent ones time out of their handshakes; the service answers again.
    eventually("a slot is free again", Duration::from_secs(10), || {
        let ca = ca_pem.clone();
        async move {
            match kubelet::https_get(port, &ca, "/readyz").await {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    drop(held);
    let _ = child.kill();
    let _ = child.wait();
}

/// An idle connection does not hold a slot forever: a keep-alive HTTP/1.1 connection that sends
/// nothing after its answer is closed by the service (its header read timeout, 5 s, runs while
/// it waits for the next request).
#[tokio::test]
async fn an_idle_connection_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut child, port, ca_pem, _dir) = standalone_service().await;
    let connector = kubelet::tls_connector(&ca_pem).expect("connector");
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("handshake");
    tls.write_all(b"GET /readyz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .expect("request");
    let mut buf = vec![0u8; 4096];
    let n = tls.read(&mut buf).await.expect("answer");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // Then nothing: the service closes the connection within its header read timeout.
    let t0 = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(15), tls.read(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "an idle connection is closed: {closed:?} after {:?}",
        t0.elapsed()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(7),
        "closed after {:?}",
        t0.elapsed()
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Malformed input gets a clear 4xx, never a crash; SIGTERM drains and exits cleanly.
#[tokio::test]
// Sends signals to child processes (libc::kill).
#[allow(unsafe_code)]
async fn malformed_requests_get_clear_client_errors() {
    let (mut child, port, ca_pem, dir) = standalone_service().await;
    let path = "/validate/protected-rbac";
    let json = "application/json";
    let cases: Vec<(&str, String, Vec<u8>, u16, &str)> = vec![
        ("invalid JSON", json.into(), b"{not json".to_vec(), 400, "not valid JSON"),
        ("not an object", json.into(), b"[1,2]".to_vec(), 400, "not a JSON object"),
        ("wrong apiVersion", json.into(), br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#.to_vec(), 400, "apiVersion must be admission.k8s.io/v1"),
        ("missing request", json.into(), br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(), 400, "has no request"),
        ("request missing fields", json.into(), br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}"#.to_vec(), 400, "request is malformed"),
        ("wrong content type", "text/plain".into(), b"{}".to_vec(), 415, "content type must be application/json"),
        ("huge body", json.into(), vec![b' '; 4 * 1024 * 1024], 413, "over"),
    ];
    for (what, ct, body, want, needle) in cases {
        let (code, text) = https_post(port, &ca_pem, path, &ct, &body)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(code, want, "{what}: {text}");
        assert!(text.contains(needle), "{what}: {text}");
    }
    // Still healthy, and still answering real reviews.
    let review = serde_json::json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-9", "kind": {"group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole"},
        "resource": {"group": "rbac.authorization.k8s.io", "version": "v1", "resource": "clusterroles"},
        "name": "cluster-admin", "operation": "DELETE", "userInfo": {"username": "alice"}}});
    let (code, text) = https_post(port, &ca_pem, path, json, review.to_string().as_bytes())
        .await
        .expect("review");
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains("\"uid\":\"u-9\"") && text.contains("\"allowed\":false"),
        "{text}"
    );
    let (_, metrics) = kubelet::https_get(port, &ca_pem, "/metrics")
        .await
        .expect("metrics");
    assert!(metrics.contains("outcome=\"bad_request\""), "{metrics}");
    assert!(metrics.contains("decision=\"denied\""), "{metrics}");

    // The agent's question to each replica (`probe::OWN_DENIALS_PATH`): a nonce it could have
    // made, or a clear refusal; no report without the probe key, which makes the proof.
    use hcp_fleet_guards::probe::{KEY_FILE, OWN_DENIALS_PATH, ProbeKey};
    let own = |q: &str| format!("{OWN_DENIALS_PATH}{q}");
    let nonce = hcp_fleet_guards::probe::nonce().expect("random");
    for (q, want, needle) in [
        ("", 400, "want ?nonce="),
        ("?nonce=", 400, "want ?nonce="),
        ("?nonce=not-hex", 400, "want ?nonce="),
        (&format!("?nonce={}", "a".repeat(65)), 400, "want ?nonce="),
        (&format!("?nonce={nonce}"), 503, "no probe key yet"),
    ] {
        let (code, text) = kubelet::https_get(port, &ca_pem, &own(q))
            .await
            .expect("own denials");
        assert_eq!((code, text.contains(needle)), (want, true), "{q}: {text}");
    }
    let key = ProbeKey::generate().expect("random");
    std::fs::write(dir.path().join(KEY_FILE), key.to_hex()).expect("key");
    let (code, text) = kubelet::https_get(port, &ca_pem, &own(&format!("?nonce={nonce}")))
        .await
        .expect("own denials");
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        key.report(&nonce, &text),
        Some(""),
        "a proven report of nothing (alice is no sender of the cluster's): {text}"
    );

    // SIGTERM: drain and exit 0.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(25);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
}

/// Every guard's table of cases (`hcp_fleet_guards`), sent as AdmissionReviews to the
/// real admission service over TLS: each answer is the one the table asks for (a denial, or
/// for the mutation a patch; in warn mode a warning), and the service's answer names the same
/// request. The same tables run through each guard's CEL form in the unit tests.
#[tokio::test]
async fn every_guards_cases_through_the_admission_service_over_tls() {
    use hcp_fleet_guards::{ALL, Want};
    // The registry the pod image spec mutation's cases are decided under, as the agent's
    // ConfigMap would be mounted.
    let registry = tempfile::tempdir().expect("dir");
    let file = registry
        .path()
        .join(hcp_fleet_render::internal_registry::KEY);
    std::fs::write(
        &file,
        serde_json::to_vec(&hcp_fleet_guards::pod_image_spec::case_registry()).expect("json"),
    )
    .expect("write");
    let (mut child, port, ca_pem, _dir) =
        standalone_service_with(&["--internal-registry", &file.to_string_lossy()]).await;
    let mut checked = 0;
    for g in ALL {
        for c in g.cases() {
            let (code, text) =
                https_post(port, &ca_pem, g.row().path, "application/json", &c.review())
                    .await
                    .unwrap_or_else(|e| panic!("{}, {}: {e}", g.row().name, c.what));
            assert_eq!(code, 200, "{}, {}: {text}", g.row().name, c.what);
            let v: serde_json::Value = serde_json::from_str(&text).expect("json");
            let r = &v["response"];
            assert_eq!(r["uid"], "u", "{text}");
            let acted = r["allowed"] == false || !r["patch"].is_null() || r["warnings"].is_array();
            assert_eq!(
                acted,
                c.want == Want::Deny,
                "{}, {}: {text}",
                g.row().name,
                c.what
            );
            checked += 1;
        }
    }
    assert!(checked > 60, "only {checked} cases");
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether OpenSSL's client completes a handshake with the service offering only `args`'s
/// protocol version and suites: an independent TLS stack, not the one the service is built on.
fn openssl_handshake(port: u16, ca: &Path, args: &[&str]) -> (bool, String) {
    support::run_to_text(
        Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
            .arg("-CAfile")
            .arg(ca)
            .args(["-verify_return_error", "-brief"])
            .args(args)
            .stdin(std::process::Stdio::null()),
    )
}

/// The admission service offers its build's suites and no others, seen from OpenSSL's
/// client: TLS 1.3 and 1.2 with AES-GCM always; ChaCha20-Poly1305 (not FIPS-approved) only in
/// the default build. The FIPS build (`make fips`) also reports FIPS mode in `version`.
#[tokio::test]
async fn the_service_offers_its_builds_protocols_and_suites_only() {
    let fips = cfg!(feature = "fips");
    assert_eq!(hcp_fleet_guards::crypto::fips_mode(), fips);
    let (mut child, port, ca, dir) = standalone_service().await;
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, ca).expect("ca file");
    let cases: [(&[&str], bool); 6] = [
        (
            &["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"],
            true,
        ),
        (
            &["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"],
            true,
        ),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"],
            true,
        ),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"],
            true,
        ),
        (
            &["-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256"],
            !fips,
        ),
        (
            &["-tls1_2", "-cipher", "ECDHE-ECDSA-CHACHA20-POLY1305"],
            !fips,
        ),
    ];
    for (args, want) in cases {
        let (ok, text) = openssl_handshake(port, &ca_file, args);
        assert_eq!(ok, want, "{args:?} (fips build: {fips}):\n{text}");
    }
    // Nothing older than TLS 1.2, in either build.
    let (ok, text) = openssl_handshake(port, &ca_file, &["-tls1_1"]);
    assert!(!ok, "TLS 1.1 accepted:\n{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_hcp-fleet-dev"))
        .arg("version")
        .output()
        .expect("version");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("fips: {fips}")), "{text}");
    assert!(text.contains(hcp_fleet_guards::crypto::LIBRARY), "{text}");
    let _ = child.kill();
    let _ = child.wait();
}
