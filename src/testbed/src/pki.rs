//! The local control plane's certificates: one CA signs every serving certificate and the
//! admin client certificate (group system:masters); one key signs service-account tokens.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use time::Duration;

use super::LocalCpError;
use hcp_fleet_render::certificates;
use hcp_fleet_render::certificates::{KeyedCert, Usage};

const LIFETIME: Duration = Duration::days(2);

pub(crate) struct Pki {
    pub(crate) ca: KeyedCert,
    pub(crate) ca_path: PathBuf,
    pub(crate) sa_key_path: PathBuf,
    pub(crate) sa_pub_path: PathBuf,
    admin: KeyedCert,
}

fn write(path: &Path, data: &str) -> Result<(), LocalCpError> {
    std::fs::write(path, data).map_err(|source| LocalCpError::Io {
        context: format!("writing {}", path.display()),
        source,
    })
}

impl Pki {
    pub(crate) fn generate(dir: &Path) -> Result<Self, LocalCpError> {
        let ca = certificates::generate_ca("hcp-fleet-agent local CA", LIFETIME)?;
        let ca_path = dir.join("ca.crt");
        write(&ca_path, &ca.cert_pem)?;
        // kube-apiserver 1.20 reads verification keys only from public-key PEM blocks.
        let (sa_private, sa_public) = certificates::generate_key_pair_pem()?;
        let sa_key_path = dir.join("service-account.key");
        let sa_pub_path = dir.join("service-account.pub");
        write(&sa_key_path, &sa_private)?;
        write(&sa_pub_path, &sa_public)?;
        let admin = certificates::issue(
            &ca,
            "local-admin",
            &Usage::Client {
                groups: vec!["system:masters".into()],
            },
            LIFETIME,
        )?;
        Ok(Self {
            ca,
            ca_path,
            sa_key_path,
            sa_pub_path,
            admin,
        })
    }

    /// A serving certificate for a kube-apiserver on loopback; returns (cert, key) paths.
    pub(crate) fn serving_pair(
        &self,
        dir: &Path,
        name: &str,
    ) -> Result<(PathBuf, PathBuf), LocalCpError> {
        let sans = vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default.svc".to_string(),
        ];
        let pair = certificates::issue(
            &self.ca,
            &format!("kube-apiserver-{name}"),
            &Usage::Server { sans },
            LIFETIME,
        )?;
        let crt = dir.join("serving.crt");
        let key = dir.join("serving.key");
        write(&crt, &pair.cert_pem)?;
        write(&key, &pair.key_pem)?;
        Ok((crt, key))
    }

    /// A kubeconfig for a client certificate of `user` in `groups`: the identities a hosted
    /// cluster's own machinery authenticates with (a kubelet's `system:node:<name>` in
    /// `system:nodes`, the controller manager's and the scheduler's names).
    pub(crate) fn client_kubeconfig(
        &self,
        name: &str,
        server: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<String, LocalCpError> {
        let pair = certificates::issue(
            &self.ca,
            user,
            &Usage::Client {
                groups: groups.iter().map(|g| g.to_string()).collect(),
            },
            LIFETIME,
        )?;
        Ok(render_kubeconfig(
            name,
            server,
            &self.ca.cert_pem,
            &pair.cert_pem,
            &pair.key_pem,
        ))
    }

    /// A self-contained admin kubeconfig (everything inline, no file paths).
    pub(crate) fn admin_kubeconfig(
        &self,
        name: &str,
        server: &str,
    ) -> Result<String, LocalCpError> {
        Ok(render_kubeconfig(
            name,
            server,
            &self.ca.cert_pem,
            &self.admin.cert_pem,
            &self.admin.key_pem,
        ))
    }
}

/// A kubeconfig with one cluster, one client-certificate user and one context.
pub(crate) fn render_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    let user = format!(
        "client-certificate-data: {}\n    client-key-data: {}",
        B64.encode(cert_pem),
        B64.encode(key_pem),
    );
    with_user(name, server, ca_pem, &user)
}

/// A kubeconfig with one cluster and a bearer-token user.
pub(crate) fn render_token_kubeconfig(
    name: &str,
    server: &str,
    ca_pem: &str,
    token: &str,
) -> String {
    with_user(name, server, ca_pem, &format!("token: {token}"))
}

/// One cluster, one user whose credentials are `user` (YAML at the user's indentation), one
/// context.
fn with_user(name: &str, server: &str, ca_pem: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: admin\n  user:\n    {user}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: admin\ncurrent-context: {name}\n",
        ca = B64.encode(ca_pem),
    )
}
