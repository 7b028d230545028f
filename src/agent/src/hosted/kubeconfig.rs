//! Hosted cluster kubeconfigs: strict validation of a secret's kubeconfig before anything
//! uses it (docs/architecture.md, step 4), and the server rewrite.
//!
//! The check is an allow-list on the raw document, not on kube's typed `Kubeconfig`: a typed
//! parse would silently drop fields it does not know, and keep ones (exec, tokenFile) that run
//! programs or read the agent's own files. A hostile secret must never do either.

use serde_json::Value;

use hcp_fleet_render::config::ServerRewrite;

/// Larger kubeconfigs are refused before parsing.
pub(crate) const MAX_KUBECONFIG_BYTES: usize = 256 * 1024;

const TOP_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "clusters",
    "users",
    "contexts",
    "current-context",
    "preferences",
    "extensions",
];
const CLUSTER_KEYS: &[&str] = &[
    "server",
    "certificate-authority-data",
    "tls-server-name",
    "extensions",
];
const USER_KEYS: &[&str] = &[
    "client-certificate-data",
    "client-key-data",
    "token",
    "username",
    "password",
    "extensions",
];
const CONTEXT_KEYS: &[&str] = &["cluster", "user", "namespace", "extensions"];

/// Why a kubeconfig was refused. Messages name the field, never its value (which may be a
/// credential).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeconfigError {
    #[error("kubeconfig is {0} bytes, over the {MAX_KUBECONFIG_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("kubeconfig is not valid YAML: {0}")]
    Syntax(String),
    #[error("kubeconfig field {field} is not allowed: {why}")]
    Forbidden { field: String, why: &'static str },
    #[error("kubeconfig is incomplete: {0}")]
    Incomplete(String),
    #[error(
        "kubeconfig server {server} is not allowed (hostedAccess.allowedServers for this namespace: {allowed:?}); a kubeconfig naming any other API server, the management cluster's own among them, is refused"
    )]
    ServerNotAllowed {
        server: String,
        allowed: Vec<String>,
    },
}

/// Where a document failed to parse, and nothing else: the parser's own message may quote the
/// text around the error (a snippet of a token or key), which would travel on to the health
/// record, Events, the ACM hub and the logs.
fn syntax_error(e: &serde_saphyr::Error) -> KubeconfigError {
    KubeconfigError::Syntax(match e.location() {
        Some(l) => format!("at line {}, column {}", l.line(), l.column()),
        None => "at an unknown position".into(),
    })
}

/// A kubeconfig that passed validation, with its server already rewritten.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ValidKubeconfig {
    pub(crate) yaml: String,
    pub(crate) server: String,
}

impl std::fmt::Debug for ValidKubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValidKubeconfig")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

fn why_forbidden(key: &str) -> &'static str {
    match key {
        "exec" | "auth-provider" => "it would run a program or plugin inside the agent",
        "tokenFile" | "client-certificate" | "client-key" | "certificate-authority" => {
            "it would read a file from the agent's own file system"
        }
        "proxy-url" => "it would send the agent's traffic through an arbitrary proxy",
        "insecure-skip-tls-verify" => "it would disable TLS verification",
        "as" | "as-groups" | "as-uid" | "as-user-extra" => "impersonation is not allowed",
        _ => "only self-contained fields are accepted",
    }
}

fn check_keys(obj: &Value, allowed: &[&str], path: &str) -> Result<(), KubeconfigError> {
    let Some(map) = obj.as_object() else {
        return Err(KubeconfigError::Incomplete(format!(
            "{path} must be a mapping"
        )));
    };
    // Sorted so the first complaint is deterministic.
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    for k in keys {
        if !allowed.contains(&k.as_str()) {
            return Err(KubeconfigError::Forbidden {
                field: format!("{path}.{k}"),
                why: why_forbidden(k),
            });
        }
    }
    Ok(())
}

fn named_entries<'a>(
    doc: &'a Value,
    list: &str,
    inner: &str,
    allowed: &[&str],
) -> Result<Vec<(String, &'a Value)>, KubeconfigError> {
    let mut out = Vec::new();
    let Some(items) = doc.get(list) else {
        return Ok(out);
    };
    let Some(items) = items.as_array() else {
        return Err(KubeconfigError::Incomplete(format!(
            "{list} must be a list"
        )));
    };
    for (i, item) in items.iter().enumerate() {
        let name = item
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| KubeconfigError::Incomplete(format!("{list}[{i}] has no name")))?;
        let body = item
            .get(inner)
            .ok_or_else(|| KubeconfigError::Incomplete(format!("{list}[{i}] has no {inner}")))?;
        check_keys(body, allowed, &format!("{list}[{i}].{inner}"))?;
        out.push((name.to_string(), body));
    }
    Ok(out)
}

/// Validates a kubeconfig from a secret and applies the first matching server rewrite
/// (`{namespace}` in the target becomes `namespace`). Every user, cluster and context is
/// checked, not only the current one: the document is what gets parsed later.
pub(crate) fn validate(
    raw: &[u8],
    namespace: &str,
    rewrites: &[ServerRewrite],
    allowed: &[String],
) -> Result<ValidKubeconfig, KubeconfigError> {
    if raw.len() > MAX_KUBECONFIG_BYTES {
        return Err(KubeconfigError::TooLarge(raw.len()));
    }
    let text = std::str::from_utf8(raw).map_err(|_| KubeconfigError::Syntax("not UTF-8".into()))?;
    let mut doc: Value = serde_saphyr::from_str(text).map_err(|e| syntax_error(&e))?;
    check_keys(&doc, TOP_KEYS, "kubeconfig")?;
    let clusters = named_entries(&doc, "clusters", "cluster", CLUSTER_KEYS)?;
    named_entries(&doc, "users", "user", USER_KEYS)?;
    let contexts = named_entries(&doc, "contexts", "context", CONTEXT_KEYS)?;

    let current = doc
        .get("current-context")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .or_else(|| (contexts.len() == 1).then(|| contexts[0].0.clone()))
        .ok_or_else(|| KubeconfigError::Incomplete("no current-context".into()))?;
    let ctx = contexts
        .iter()
        .find(|(n, _)| *n == current)
        .map(|(_, c)| *c)
        .ok_or_else(|| {
            KubeconfigError::Incomplete(format!("current-context {current:?} is not defined"))
        })?;
    let cluster_name = ctx
        .get("cluster")
        .and_then(Value::as_str)
        .ok_or_else(|| KubeconfigError::Incomplete("current context names no cluster".into()))?
        .to_string();
    let user_name = ctx
        .get("user")
        .and_then(Value::as_str)
        .ok_or_else(|| KubeconfigError::Incomplete("current context names no user".into()))?;
    let cluster = clusters
        .iter()
        .find(|(n, _)| *n == cluster_name)
        .map(|(_, c)| *c)
        .ok_or_else(|| {
            KubeconfigError::Incomplete(format!("cluster {cluster_name:?} is not defined"))
        })?;
    let server = cluster
        .get("server")
        .and_then(Value::as_str)
        .ok_or_else(|| KubeconfigError::Incomplete("cluster has no server".into()))?;
    if let Err(why) = parse_server(server) {
        return Err(KubeconfigError::Forbidden {
            field: "cluster.server".into(),
            why,
        });
    }
    if cluster.get("certificate-authority-data").is_none() {
        return Err(KubeconfigError::Incomplete(
            "cluster has no certificate-authority-data".into(),
        ));
    }
    let user_ok = doc
        .get("users")
        .and_then(Value::as_array)
        .and_then(|u| {
            u.iter()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(user_name))
        })
        .and_then(|e| e.get("user"))
        .is_some_and(|u| {
            (u.get("client-certificate-data").is_some() && u.get("client-key-data").is_some())
                || u.get("token").is_some()
                || u.get("username").is_some()
        });
    if !user_ok {
        return Err(KubeconfigError::Incomplete(format!(
            "user {user_name:?} has no client certificate, token or basic credentials"
        )));
    }

    let rewritten = rewrite_server(server, namespace, rewrites);
    if rewritten != server
        && let Some(items) = doc.get_mut("clusters").and_then(Value::as_array_mut)
    {
        for item in items {
            if item.get("name").and_then(Value::as_str) == Some(cluster_name.as_str())
                && let Some(s) = item.get_mut("cluster").and_then(|c| c.get_mut("server"))
            {
                *s = Value::String(rewritten.clone());
            }
        }
    }
    if !server_allowed(&rewritten, namespace, allowed) {
        return Err(KubeconfigError::ServerNotAllowed {
            server: rewritten,
            allowed: allowed
                .iter()
                .map(|p| p.replace("{namespace}", namespace))
                .collect(),
        });
    }
    // JSON is YAML; kube's parser takes it as is.
    let yaml = serde_json::to_string(&doc).map_err(|e| KubeconfigError::Syntax(e.to_string()))?;
    Ok(ValidKubeconfig {
        yaml,
        server: rewritten,
    })
}

/// A hosted API server's URL, parsed (by `http::Uri`) and held to what a kubeconfig server
/// needs: `https`, a host, a numeric port or none, a path. User information (`user@host`: the
/// host is what follows the `@`), a query and a fragment are refused, so what is compared is
/// what the client connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerUrl {
    pub(crate) host: String,
    pub(crate) port: Option<u16>,
    /// Without its trailing `/` (empty for none).
    pub(crate) path: String,
}

impl std::fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "https://{}", self.host)?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        f.write_str(&self.path)
    }
}

/// `server` parsed, or why it is refused (no part of it quoted: the reason names the rule).
pub(crate) fn parse_server(server: &str) -> Result<ServerUrl, &'static str> {
    if server.contains('#') {
        return Err("a fragment (#) is not accepted");
    }
    let uri: http::Uri = server.parse().map_err(|_| "not a URL")?;
    if uri.scheme_str() != Some("https") {
        return Err("only https:// servers are accepted");
    }
    if uri.query().is_some() {
        return Err("a query (?) is not accepted");
    }
    let authority = uri.authority().ok_or("no host")?;
    if authority.as_str().contains('@') {
        return Err("user information (user@host) is not accepted");
    }
    let host = authority.host().to_ascii_lowercase();
    if host.is_empty() {
        return Err("no host");
    }
    let port = match authority.port() {
        Some(p) => Some(p.as_u16()),
        None if authority.as_str() == authority.host() => None,
        None => return Err("a port that is not a number"),
    };
    Ok(ServerUrl {
        host,
        port,
        path: uri.path().trim_end_matches('/').to_string(),
    })
}

/// Whether `server` (after rewriting) matches one of `patterns`, compared part by part on the
/// parsed URL: `https` only; the host by a glob (`{namespace}` stands for the HCP namespace,
/// `*` for any run of host characters); the port equal, or `*` for any; the path equal (a
/// trailing `/` ignored). A server that does not parse matches nothing.
pub(crate) fn server_allowed(server: &str, namespace: &str, patterns: &[String]) -> bool {
    let Ok(url) = parse_server(server) else {
        return false;
    };
    patterns.iter().any(|p| {
        let p = p.replace("{namespace}", namespace);
        let Some(rest) = p.strip_prefix("https://") else {
            return false;
        };
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, port)) if port == "*" || port.chars().all(|c| c.is_ascii_digit()) => {
                (h, Some(port))
            }
            _ => (authority, None),
        };
        let port_ok = match (port, url.port) {
            (Some("*"), _) => true,
            (Some(want), Some(have)) => want.parse::<u16>().ok() == Some(have),
            (None, None) => true,
            _ => false,
        };
        port_ok
            && glob(host.to_ascii_lowercase().as_bytes(), url.host.as_bytes())
            && path.trim_end_matches('/') == url.path
    })
}

/// `*` matches any run of bytes without `/`; everything else matches itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => {
            let mut i = 0;
            loop {
                if glob(rest, &text[i..]) {
                    return true;
                }
                if i == text.len() || text[i] == b'/' {
                    return false;
                }
                i += 1;
            }
        }
        Some((c, rest)) => text
            .split_first()
            .is_some_and(|(t, trest)| t == c && glob(rest, trest)),
    }
}

/// The first rewrite that matches wins:
/// - `from` a host (no `://`): the server's host is replaced by `to`, its port and path kept.
///   HyperShift publishes `https://kube-apiserver:<port>` with the port the platform uses
///   (6443, 2040 on IBM Cloud), so the host is what identifies it.
/// - `from` a whole URL: the server must equal it (ignoring a trailing '/') and becomes `to`.
///
/// A server that does not parse (`parse_server`) is left as it is, to be refused.
pub(crate) fn rewrite_server(server: &str, namespace: &str, rewrites: &[ServerRewrite]) -> String {
    let norm = server.trim_end_matches('/');
    for rw in rewrites {
        if rw.from.contains("://") {
            if rw.from.trim_end_matches('/') == norm {
                return rw.to.replace("{namespace}", namespace);
            }
            continue;
        }
        if let Ok(url) = parse_server(server)
            && url.host.eq_ignore_ascii_case(&rw.from)
        {
            return ServerUrl {
                host: rw.to.replace("{namespace}", namespace),
                ..url
            }
            .to_string();
        }
    }
    server.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_render::config::HostedAccessConfig;

    fn kc(cluster_extra: &str, user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://kube-apiserver:6443\n    certificate-authority-data: Zm9v\n{cluster_extra}users:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        )
    }
    const CERT_USER: &str = "    client-certificate-data: Zm9v\n    client-key-data: YmFy\n";

    fn check(doc: &str) -> Result<ValidKubeconfig, KubeconfigError> {
        let h = HostedAccessConfig::default();
        validate(
            doc.as_bytes(),
            "clusters-hc-1",
            &h.server_rewrites,
            &h.allowed_servers,
        )
    }

    #[test]
    fn self_contained_kubeconfig_is_accepted_and_rewritten() {
        let v = check(&kc("", CERT_USER)).expect("valid");
        assert_eq!(v.server, "https://kube-apiserver.clusters-hc-1.svc:6443");
        assert!(v.yaml.contains("kube-apiserver.clusters-hc-1.svc"));
        // and kube can parse what we hand it
        kube::config::Kubeconfig::from_yaml(&v.yaml).expect("kube parses it");
    }

    #[test]
    fn hostile_fields_are_refused_by_name() {
        let cases = [
            (
                kc(
                    "",
                    "    exec:\n      command: /bin/touch\n      apiVersion: client.authentication.k8s.io/v1\n",
                ),
                "users[0].user.exec",
                "run a program",
            ),
            (
                kc("", "    auth-provider:\n      name: gcp\n"),
                "users[0].user.auth-provider",
                "run a program",
            ),
            (
                kc(
                    "",
                    "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                ),
                "users[0].user.tokenFile",
                "read a file",
            ),
            (
                kc(
                    "",
                    "    client-certificate: /etc/cert\n    client-key: /etc/key\n",
                ),
                "users[0].user.client-certificate",
                "read a file",
            ),
            (
                kc("    certificate-authority: /etc/ca\n", CERT_USER),
                "clusters[0].cluster.certificate-authority",
                "read a file",
            ),
            (
                kc("    proxy-url: http://evil:3128\n", CERT_USER),
                "clusters[0].cluster.proxy-url",
                "proxy",
            ),
            (
                kc("    insecure-skip-tls-verify: true\n", CERT_USER),
                "clusters[0].cluster.insecure-skip-tls-verify",
                "TLS",
            ),
        ];
        for (doc, field, why) in cases {
            let err = check(&doc).expect_err(field);
            let msg = err.to_string();
            assert!(msg.contains(field) && msg.contains(why), "{field}: {msg}");
        }
    }

    #[test]
    fn key_path_in_a_non_current_user_is_still_refused() {
        let doc = kc("", CERT_USER).replace(
            "contexts:",
            "- name: other\n  user:\n    client-key: /root/.ssh/id_rsa\ncontexts:",
        );
        let err = check(&doc).expect_err("refused");
        assert!(
            err.to_string().contains("users[1].user.client-key"),
            "{err}"
        );
    }

    #[test]
    fn malformed_and_incomplete_are_clear() {
        assert!(matches!(check("{{{"), Err(KubeconfigError::Syntax(_))));
        assert!(matches!(check("[]"), Err(KubeconfigError::Incomplete(_))));
        let no_creds = kc("", "    extensions: []\n");
        assert!(matches!(
            check(&no_creds),
            Err(KubeconfigError::Incomplete(_))
        ));
        let http = kc("", CERT_USER).replace("https://kube-apiserver:6443", "http://x");
        assert!(matches!(
            check(&http),
            Err(KubeconfigError::Forbidden { .. })
        ));
        let big = vec![b'a'; MAX_KUBECONFIG_BYTES + 1];
        assert!(matches!(
            validate(&big, "ns", &[], &[]),
            Err(KubeconfigError::TooLarge(_))
        ));
        assert!(matches!(
            validate(&[0xff, 0xfe], "ns", &[], &[]),
            Err(KubeconfigError::Syntax(_))
        ));
    }

    #[test]
    fn errors_never_echo_credentials() {
        let doc = kc("", "    token: s3cr3t-token\n    tokenFile: /x\n");
        let msg = check(&doc).expect_err("refused").to_string();
        assert!(!msg.contains("s3cr3t"), "{msg}");
    }

    #[test]
    fn servers_without_a_matching_rewrite_are_kept() {
        assert_eq!(
            rewrite_server(
                "https://127.0.0.1:1234",
                "ns",
                &HostedAccessConfig::default().server_rewrites
            ),
            "https://127.0.0.1:1234"
        );
        assert_eq!(
            rewrite_server(
                "https://kube-apiserver:6443/",
                "ns",
                &HostedAccessConfig::default().server_rewrites
            ),
            "https://kube-apiserver.ns.svc:6443"
        );
    }

    #[test]
    fn the_rewrite_matches_the_host_and_keeps_the_port() {
        let rw = &HostedAccessConfig::default().server_rewrites;
        // IBM Cloud publishes port 2040; any port, and no port, keep theirs.
        for (from, to) in [
            (
                "https://kube-apiserver:2040",
                "https://kube-apiserver.ns.svc:2040",
            ),
            (
                "https://kube-apiserver:6443",
                "https://kube-apiserver.ns.svc:6443",
            ),
            ("https://kube-apiserver", "https://kube-apiserver.ns.svc"),
            (
                "https://kube-apiserver:6443/x/",
                "https://kube-apiserver.ns.svc:6443/x",
            ),
            // Not the host: left alone.
            (
                "https://kube-apiserver-x:6443",
                "https://kube-apiserver-x:6443",
            ),
            ("https://[::1]:6443", "https://[::1]:6443"),
        ] {
            assert_eq!(rewrite_server(from, "ns", rw), to, "{from}");
        }
        // A whole-URL rewrite still matches exactly.
        let exact = [ServerRewrite {
            from: "https://kas.example:443".into(),
            to: "https://kas.{namespace}.svc:443".into(),
        }];
        assert_eq!(
            rewrite_server("https://kas.example:443", "ns", &exact),
            "https://kas.ns.svc:443"
        );
        assert_eq!(
            rewrite_server("https://kas.example:444", "ns", &exact),
            "https://kas.example:444"
        );
        // And port 2040 passes the default allow-list once rewritten.
        let doc = kc("", CERT_USER).replace("kube-apiserver:6443", "kube-apiserver:2040");
        assert_eq!(
            check(&doc).expect("port 2040").server,
            "https://kube-apiserver.clusters-hc-1.svc:2040"
        );
    }

    #[test]
    fn only_allowed_servers_pass_by_default_the_hcps_own_kube_apiserver() {
        // The management cluster's own API server, or another HCP's, is refused by name.
        for other in [
            "https://kubernetes.default.svc:443",
            "https://api.management.example.com:6443",
            "https://kube-apiserver.clusters-hc-2.svc:6443",
        ] {
            let doc = kc("", CERT_USER).replace("https://kube-apiserver:6443", other);
            let err = check(&doc).expect_err(other);
            assert!(
                matches!(err, KubeconfigError::ServerNotAllowed { .. }),
                "{err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(other), "{msg}");
            assert!(msg.contains("kube-apiserver.clusters-hc-1.svc:*"), "{msg}");
        }
        // Already in its long form, the HCP's own is accepted too.
        let own = kc("", CERT_USER).replace(
            "https://kube-apiserver:6443",
            "https://kube-apiserver.clusters-hc-1.svc:6443/",
        );
        check(&own).expect("its own kube-apiserver");
    }

    #[test]
    fn allow_patterns_take_the_namespace_and_a_star_within_one_segment() {
        let p = |xs: &[&str]| xs.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let loopback = p(&["https://127.0.0.1:*"]);
        assert!(server_allowed("https://127.0.0.1:40123", "ns", &loopback));
        assert!(server_allowed("https://127.0.0.1:40123/", "ns", &loopback));
        assert!(!server_allowed("https://127.0.0.1:1/evil", "ns", &loopback));
        assert!(!server_allowed(
            "https://127.0.0.10:1",
            "ns",
            &p(&["https://127.0.0.1:1"])
        ));
        let own = p(&["https://kube-apiserver.{namespace}.svc:6443"]);
        assert!(server_allowed(
            "https://kube-apiserver.a.svc:6443",
            "a",
            &own
        ));
        assert!(!server_allowed(
            "https://kube-apiserver.b.svc:6443",
            "a",
            &own
        ));
        assert!(!server_allowed("https://x", "a", &[]));
        let star = p(&["https://*.{namespace}.svc:6443"]);
        assert!(server_allowed("https://kas.a.svc:6443", "a", &star));
        assert!(!server_allowed("https://kas.b.svc:6443", "a", &star));
        // Scheme, host and port compared apart: a port pattern never spills into the host.
        let any_port = p(&["https://kube-apiserver.{namespace}.svc:*"]);
        assert!(!server_allowed(
            "https://kube-apiserver.a.svc:6443@10.0.0.5:443",
            "a",
            &any_port
        ));
        assert!(!server_allowed(
            "https://kube-apiserver.a.svc.evil.example:6443",
            "a",
            &any_port
        ));
        assert!(!server_allowed(
            "https://kube-apiserver.a.svc",
            "a",
            &p(&["https://kube-apiserver.a.svc:6443"])
        ));
        assert!(server_allowed(
            "https://KUBE-apiserver.a.svc:6443",
            "a",
            &any_port
        ));
    }

    /// What the client would connect to is what is checked: a URL whose host hides behind user
    /// information, or carries a query or a fragment, is refused, naming the field and the
    /// rule, quoting nothing of the URL.
    #[test]
    fn user_information_query_and_fragment_are_refused_by_field() {
        for (server, rule) in [
            (
                "https://kube-apiserver:6443@10.0.0.5:443",
                "user information",
            ),
            (
                "https://tok3n-s3cr3t@kube-apiserver:6443",
                "user information",
            ),
            ("https://kube-apiserver:6443/?x=tok3n-s3cr3t", "a query"),
            ("https://kube-apiserver:6443/#tok3n-s3cr3t", "a fragment"),
            ("https://kube-apiserver:http", "not a number"),
        ] {
            let doc = kc("", CERT_USER).replace("https://kube-apiserver:6443", server);
            let err = check(&doc).expect_err(server);
            assert!(
                matches!(&err, KubeconfigError::Forbidden { field, .. } if field == "cluster.server"),
                "{server}: {err}"
            );
            let msg = err.to_string();
            assert!(msg.contains(rule), "{server}: {msg}");
            assert!(!msg.contains("tok3n") && !msg.contains("10.0.0.5"), "{msg}");
        }
        // After the rewrite, the userinfo form is refused too: the allow-list never sees it.
        let rw = &HostedAccessConfig::default().server_rewrites;
        assert_eq!(
            rewrite_server("https://kube-apiserver:6443@10.0.0.5:443", "ns", rw),
            "https://kube-apiserver:6443@10.0.0.5:443"
        );
    }

    /// A malformed document is refused with where it broke, never with the text around it
    /// (the parser's own message quotes it: a token's fragment would reach the health record,
    /// Events, the hub and the logs).
    #[test]
    fn a_yaml_error_names_its_position_and_quotes_nothing() {
        for doc in [
            "apiVersion: v1\nusers:\n- name: u\n  user:\n    token: \"s3cr3t-tok3n-abcdef\n",
            "users: [{name: u, user: {token: s3cr3t-tok3n-abcdef}\n",
            "users:\n  - name: u\n   user: s3cr3t-tok3n-abcdef\n",
        ] {
            let err = check(doc).expect_err("malformed");
            let msg = err.to_string();
            assert!(matches!(err, KubeconfigError::Syntax(_)), "{msg}");
            assert!(msg.contains("line "), "{msg}");
            assert!(!msg.contains("s3cr3t") && !msg.contains("abcdef"), "{msg}");
        }
    }
}
