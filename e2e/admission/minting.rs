//! What each guard of the cluster's identities and platform objects refuses a regular user
//! through the hosted kube-apiserver, and the harmless neighbours it lets through: called by
//! `each_guard_answers_through` on every engine.

use super::*;

/// A non-exempt user cannot make themself exempt: not by joining an exempt Group, not by
/// creating a namespace whose name is reserved (`openshift-x`, even labelled as a control-plane
/// namespace), not by minting a service account, a token or a token Secret in one
/// (`kube-system` here; its service accounts are exempt). Harmless neighbours pass.
pub(super) async fn identities_cannot_be_minted(
    bed: &Bed,
    hosted: &Client,
    answered_by: &dyn Fn(&str) -> String,
) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let groups_ar = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("user.openshift.io", "v1", "Group"),
        "groups",
    );
    let sre: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "user.openshift.io/v1", "kind": "Group",
        "metadata": {"name": "osd-sre-admins"}, "users": ["sre"],
    }))
    .expect("group");
    Api::<kube::api::DynamicObject>::all_with(hosted.clone(), &groups_ar)
        .create(&PostParams::default(), &sre)
        .await
        .expect("the exempt admin creates the SRE group");
    let groups = "identity-groups.hcp-fleet.openshift.io";
    let (ok, out) = kubectl(
        bed,
        &[
            "--as=alice",
            "patch",
            "groups.user.openshift.io",
            "osd-sre-admins",
            "--type=merge",
            "-p",
            r#"{"users":["sre","alice"]}"#,
            "--dry-run=server",
        ],
    );
    assert!(
        !ok && out.contains(&answered_by(groups))
            && out.contains("changing the Group \"osd-sre-admins\" is not allowed"),
        "joining an exempt Group: {out}"
    );
    let (ok, out) = kubectl_stdin(
        bed,
        &["--as=alice", "create", "-f", "-", "--dry-run=server"],
        r#"{"apiVersion": "user.openshift.io/v1", "kind": "Group", "metadata": {"name": "team-a"}, "users": ["alice"]}"#,
    );
    assert!(ok, "a Group of one's own: {out}");

    let namespaces = "identity-namespaces.hcp-fleet.openshift.io";
    for labels in ["{}", r#"{"openshift.io/run-level": "0"}"#] {
        let (ok, out) = kubectl_stdin(
            bed,
            &["--as=alice", "create", "-f", "-", "--dry-run=server"],
            &format!(
                r#"{{"apiVersion": "v1", "kind": "Namespace", "metadata": {{"name": "openshift-x", "labels": {labels}}}}}"#
            ),
        );
        assert!(
            !ok && out.contains(&answered_by(namespaces))
                && out.contains("creating the namespace \"openshift-x\" is not allowed"),
            "openshift-x labelled {labels}: {out}"
        );
    }
    let (ok, out) = kubectl(
        bed,
        &[
            "--as=alice",
            "create",
            "namespace",
            "team-b",
            "--dry-run=server",
        ],
    );
    assert!(ok, "a team namespace: {out}");

    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "builder"}})).expect("sa");
    Api::<ServiceAccount>::namespaced(hosted.clone(), "kube-system")
        .create(&PostParams::default(), &sa)
        .await
        .expect("the exempt admin creates a service account");
    let (ok, out) = kubectl(
        bed,
        &[
            "--as=alice",
            "-n",
            "kube-system",
            "create",
            "serviceaccount",
            "bot",
            "--dry-run=server",
        ],
    );
    assert!(
        !ok && out.contains(&answered_by(namespaces))
            && out.contains("creating a service account in the namespace \"kube-system\""),
        "a service account in kube-system: {out}"
    );
    // TokenRequest has no dry run in kubectl 1.20; a guard that let it through would hand
    // alice a token, which the assertion would show.
    let (ok, out) = kubectl_stdin(
        bed,
        &[
            "--as=alice",
            "create",
            "--raw",
            "/api/v1/namespaces/kube-system/serviceaccounts/builder/token",
            "-f",
            "-",
        ],
        r#"{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": ["https://kubernetes.default.svc"]}}"#,
    );
    assert!(
        !ok && out.contains("requesting a service account token in the namespace \"kube-system\""),
        "a token for kube-system's builder: {out}"
    );
    let (ok, out) = kubectl_stdin(
        bed,
        &[
            "--as=alice",
            "-n",
            "kube-system",
            "create",
            "-f",
            "-",
            "--dry-run=server",
        ],
        r#"{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "builder-token", "annotations": {"kubernetes.io/service-account.name": "builder"}}, "type": "kubernetes.io/service-account-token"}"#,
    );
    assert!(
        !ok && out.contains(&answered_by(namespaces))
            && out.contains(
                "creating a service account token Secret in the namespace \"kube-system\""
            ),
        "a token Secret in kube-system: {out}"
    );
    let (ok, out) = kubectl(
        bed,
        &[
            "--as=alice",
            "-n",
            "team-a",
            "create",
            "serviceaccount",
            "bot",
            "--dry-run=server",
        ],
    );
    assert!(ok, "a service account in a team namespace: {out}");
}

/// The platform's service accounts and the ClusterRoleBindings that grant them their rights
/// (MCVW's serviceaccount and clusterrolebinding webhooks): a regular user may not delete
/// either, nor take the account out of the binding; adding a subject, or deleting an account
/// OpenShift puts back, passes. Nor may they write `openshift-config/user-ca-bundle` (its
/// regular-user webhook), where another ConfigMap passes.
pub(super) async fn platform_accounts_and_bindings(
    bed: &Bed,
    hosted: &Client,
    answered_by: &dyn Fn(&str) -> String,
) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    for name in ["e2e-platform", "deployer"] {
        let sa: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("sa");
        Api::<ServiceAccount>::namespaced(hosted.clone(), "kube-system")
            .create(&PostParams::default(), &sa)
            .await
            .expect("the exempt admin creates a platform account");
    }
    let accounts = "service-accounts.hcp-fleet.openshift.io";
    let delete_sa = |name: &'static str| {
        kubectl(
            bed,
            &[
                "--as=alice",
                "-n",
                "kube-system",
                "delete",
                "serviceaccount",
                name,
                "--dry-run=server",
            ],
        )
    };
    let (ok, out) = delete_sa("e2e-platform");
    assert!(
        !ok && out.contains(&answered_by(accounts))
            && out.contains("deleting the service account \"e2e-platform\" in the namespace \"kube-system\" is not allowed"),
        "deleting a platform account: {out}"
    );
    let (ok, out) = delete_sa("deployer");
    assert!(ok, "deleting an account OpenShift puts back: {out}");

    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "e2e-platform"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "e2e-platform", "namespace": "kube-system"}],
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(hosted.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the exempt admin binds the platform account");
    let bindings = "platform-bindings.hcp-fleet.openshift.io";
    let (ok, out) = kubectl(
        bed,
        &[
            "--as=alice",
            "delete",
            "clusterrolebinding",
            "e2e-platform",
            "--dry-run=server",
        ],
    );
    assert!(
        !ok && out.contains(&answered_by(bindings))
            && out.contains("deleting the ClusterRoleBinding \"e2e-platform\" is not allowed on a managed cluster: it grants the service account kube-system/e2e-platform of the platform its rights"),
        "deleting a platform binding: {out}"
    );
    let patch = |subjects: &str| {
        kubectl(
            bed,
            &[
                "--as=alice",
                "patch",
                "clusterrolebinding",
                "e2e-platform",
                "--type=merge",
                "-p",
                &format!(r#"{{"subjects":{subjects}}}"#),
                "--dry-run=server",
            ],
        )
    };
    let (ok, out) =
        patch(r#"[{"kind":"Group","apiGroup":"rbac.authorization.k8s.io","name":"team-a"}]"#);
    assert!(
        !ok && out.contains(&answered_by(bindings))
            && out.contains("taking a subject out of the ClusterRoleBinding \"e2e-platform\""),
        "taking the platform account out: {out}"
    );
    let (ok, out) = patch(
        r#"[{"kind":"ServiceAccount","name":"e2e-platform","namespace":"kube-system"},{"kind":"Group","apiGroup":"rbac.authorization.k8s.io","name":"team-a"}]"#,
    );
    assert!(ok, "adding a subject: {out}");

    // The cluster's configuration: the proxy's trust bundle is the control plane's.
    hcp_fleet_testbed::fixtures::ensure_namespace(hosted, "openshift-config", Default::default())
        .await
        .expect("namespace");
    let config = "platform-config.hcp-fleet.openshift.io";
    let create_cm = |name: &str| {
        kubectl_stdin(
            bed,
            &["--as=alice", "create", "-f", "-", "--dry-run=server"],
            &format!(
                r#"{{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {{"name": "{name}", "namespace": "openshift-config"}}, "data": {{"ca-bundle.crt": "x"}}}}"#
            ),
        )
    };
    let (ok, out) = create_cm("user-ca-bundle");
    assert!(
        !ok && out.contains(&answered_by(config))
            && out.contains("configmaps \"user-ca-bundle\" in API group core is managed by the service on a managed cluster; regular users may not create it"),
        "the proxy's trust bundle: {out}"
    );
    let (ok, out) = create_cm("team-settings");
    assert!(ok, "another ConfigMap there: {out}");
}
