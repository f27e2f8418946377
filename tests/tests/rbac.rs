//! The pod's RBAC (`manifests/deploy/rbac.yaml`) says the truth: [`NEEDS`] is the one table
//! of what the ServiceAccount may do, with who needs each right and why.
//!
//! - The manifests grant exactly the table: a right the table does not state fails the test
//!   (a new rule needs a stated reason), and so does a row the manifests no longer grant.
//! - `docs/security.md` lists the same rows.
//! - Against the real API server, with the manifests applied, a SubjectAccessReview for the
//!   ServiceAccount (user and groups as its token carries them) allows every right of the
//!   table, denies every other verb on the same resources, denies the Lease rights outside
//!   the pod's namespace, and denies [`MUST_NOT`], rights that would make the account an
//!   administrator of anything.
//!
//! That the rights are enough to provision a Cluster is `manifests.rs`.

use anyhow::{Context, Result, bail, ensure};
use capt_tests::{env, repo_root};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde_json::Value;
use std::collections::BTreeSet;

/// The ServiceAccount both containers run as.
const NAMESPACE: &str = "capt-system";
const ACCOUNT: &str = "capt-controller";

/// Which container uses a right. Both run as the same ServiceAccount (a pod has one
/// identity), so each can use all of them: this says who needs it, not who can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Controller,
    Applier,
    Both,
}

impl Who {
    fn as_str(self) -> &'static str {
        match self {
            Who::Controller => "controller",
            Who::Applier => "status-applier",
            Who::Both => "both",
        }
    }
}

/// Where a right holds: in every namespace (the ClusterRole), or only in the pod's own
/// namespace (a Role in capt-system).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    Cluster,
    Own,
}

impl Scope {
    fn as_str(self) -> &'static str {
        match self {
            Scope::Cluster => "cluster",
            Scope::Own => "capt-system",
        }
    }
}

/// One resource the account may use, the verbs, who needs them and why.
struct Need {
    scope: Scope,
    group: &'static str,
    /// `resource` or `resource/subresource`.
    resource: &'static str,
    verbs: &'static [&'static str],
    who: Who,
    why: &'static str,
}

const fn need(
    scope: Scope,
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    who: Who,
    why: &'static str,
) -> Need {
    Need {
        scope,
        group,
        resource,
        verbs,
        who,
        why,
    }
}

const INFRA: &str = "infrastructure.cluster.x-k8s.io";
const CONTROL_PLANE: &str = "controlplane.cluster.x-k8s.io";
const CAPI: &str = "cluster.x-k8s.io";
use Scope::{Cluster, Own};
use Who::{Applier, Both, Controller};

/// Everything the ServiceAccount may do. `rbac.yaml` must grant exactly this.
const NEEDS: &[Need] = &[
    need(
        Cluster,
        INFRA,
        "captclusters",
        &["get", "list", "watch", "patch"],
        Both,
        "controller: informer, fresh GETs, its finalizer and spec.workspaceTemplateApplyName \
         (patch); status-applier: live cache (list, watch), re-read after a conflict (get)",
    ),
    need(
        Cluster,
        INFRA,
        "captclusters/status",
        &["patch"],
        Applier,
        "server-side apply of status (capt-captcluster)",
    ),
    need(
        Cluster,
        CONTROL_PLANE,
        "captcontrolplanes",
        &["get", "list", "watch", "patch"],
        Both,
        "controller: informer, fresh GETs, listing a namespace's control planes during \
         deletion, its finalizer and spec.workspaceTemplateApplyName; status-applier: live \
         cache, re-read, spec.controlPlaneEndpoint (capt-captcontrolplane)",
    ),
    need(
        Cluster,
        CONTROL_PLANE,
        "captcontrolplanes/status",
        &["patch"],
        Applier,
        "server-side apply of status (capt-captcontrolplane)",
    ),
    need(
        Cluster,
        CONTROL_PLANE,
        "captcontrolplanes/finalizers",
        &["update"],
        Controller,
        "the <cluster>-kubeconfig Secret's owner reference blocks the control plane's \
         deletion, which OwnerReferencesPermissionEnforcement allows only to who may update \
         the owner's finalizers",
    ),
    need(
        Cluster,
        INFRA,
        "workspacetemplateapplies",
        &["get", "list", "watch", "create", "patch", "delete"],
        Both,
        "controller: informer, server-side apply (create when missing; spec, labels, \
         adoption, its finalizer, orphaning), deletion in the deletion order; status-applier: \
         live cache, re-read",
    ),
    need(
        Cluster,
        INFRA,
        "workspacetemplateapplies/status",
        &["patch"],
        Applier,
        "server-side apply of status (capt-workspacetemplateapply)",
    ),
    need(
        Cluster,
        INFRA,
        "workspacetemplates",
        &["get", "list", "watch"],
        Controller,
        "renders each Workspace from its template; a template change wakes its applies",
    ),
    need(
        Cluster,
        "tf.upbound.io",
        "workspaces",
        &["get", "list", "watch", "create", "patch", "delete"],
        Controller,
        "renders Workspaces (cluster-scoped) by server-side apply, watches their readiness \
         and outputs, deletes them with their apply",
    ),
    need(
        Cluster,
        CAPI,
        "clusters",
        &["get", "list", "watch", "patch"],
        Both,
        "controller: informer (pausing, references); status-applier: live cache, re-read, \
         spec.controlPlaneEndpoint (capt-cluster, only where Cluster API core does not run)",
    ),
    need(
        Cluster,
        CAPI,
        "clusters/status",
        &["patch"],
        Applier,
        "server-side apply of status (capt-cluster, only where Cluster API core does not run)",
    ),
    need(
        Cluster,
        "",
        "secrets",
        &["get", "create", "patch"],
        Controller,
        "by name only, never list or watch: the connection Secret's needed keys, existence \
         of waitForSecrets (metadata), the live <cluster>-kubeconfig; server-side apply of \
         <cluster>-kubeconfig (create, patch)",
    ),
    need(
        Cluster,
        "",
        "namespaces",
        &["get"],
        Controller,
        "at start, by name: each namespace trusted with code carries the install's label, \
         set when it was created; else the controller refuses to start",
    ),
    need(
        Cluster,
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Both,
        "status-applier: conflicts reported as Events on the objects; controller: a Workspace \
         that belongs to another apply (created, patched when one recurs)",
    ),
    need(
        Cluster,
        "authentication.k8s.io",
        "tokenreviews",
        &["create"],
        Both,
        "each container's metrics listener authenticates a scraper's bearer token (HTTPS \
         metrics, as Cluster API providers serve them)",
    ),
    need(
        Cluster,
        "authorization.k8s.io",
        "subjectaccessreviews",
        &["create"],
        Both,
        "each container's metrics listener asks whether the scraper may get /metrics",
    ),
    need(
        Own,
        "coordination.k8s.io",
        "leases",
        &["get", "create", "patch", "list", "watch"],
        Both,
        "leader election: the controller gets, creates when missing, patches to acquire, renew \
         and release; the status-applier lists and watches it (by a field selector on its \
         name) to write only while it names its own pod",
    ),
];

/// Every verb the table could grant; the verbs of a resource the table does not name must be
/// denied.
const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// Rights the account must not have, beyond the verbs [`NEEDS`] leaves out: (namespace,
/// group, resource, verbs, why). `""` as namespace: every namespace (or cluster-scoped).
const MUST_NOT: &[(&str, &str, &str, &[&str], &str)] = &[
    ("", "*", "*", &["*"], "nothing like cluster-admin"),
    (
        "",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["create", "update", "patch", "delete"],
        "the CRDs are installed by the operator",
    ),
    (
        NAMESPACE,
        "apps",
        "deployments",
        &["create", "update", "patch", "delete"],
        "it cannot change its own pod",
    ),
    (
        NAMESPACE,
        "",
        "pods",
        &["create", "delete"],
        "it starts no workload",
    ),
    (NAMESPACE, "", "pods/exec", &["create"], "no exec"),
    (
        NAMESPACE,
        "",
        "configmaps",
        &["get", "list"],
        "the policy is mounted, not read from the API",
    ),
    (
        NAMESPACE,
        "",
        "serviceaccounts/token",
        &["create"],
        "no tokens for other identities",
    ),
    (
        "",
        "",
        "serviceaccounts",
        &["impersonate"],
        "no impersonation",
    ),
    ("", "", "users", &["impersonate"], "no impersonation"),
    ("", "", "groups", &["impersonate"], "no impersonation"),
    (
        "",
        "rbac.authorization.k8s.io",
        "clusterroles",
        &["create", "update", "patch", "bind", "escalate"],
        "no way to widen its own rights",
    ),
    (
        "",
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        &["create", "update", "patch"],
        "no way to widen its own rights",
    ),
    (
        NAMESPACE,
        "rbac.authorization.k8s.io",
        "rolebindings",
        &["create", "update", "patch"],
        "no way to widen its own rights",
    ),
    (
        "",
        "",
        "namespaces",
        &["create", "delete"],
        "namespaces are not its business",
    ),
    (
        "",
        "",
        "events",
        &["create", "patch"],
        "Events are written through events.k8s.io only",
    ),
    (
        "",
        "",
        "nodes",
        &["get", "list"],
        "nodes are not its business",
    ),
];

/// (scope, group, resource, verb) for every verb of the table.
fn table() -> BTreeSet<(Scope, String, String, String)> {
    NEEDS
        .iter()
        .flat_map(|n| {
            n.verbs.iter().map(move |v| {
                (
                    n.scope,
                    n.group.to_owned(),
                    n.resource.to_owned(),
                    (*v).to_owned(),
                )
            })
        })
        .collect()
}

fn documents(file: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo_root().join("manifests/deploy").join(file))?;
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Ok(serde::Deserialize::deserialize(d)?))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// True when `binding` names the pod's ServiceAccount among its subjects.
fn binds_the_account(binding: &Value) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == ACCOUNT && s["namespace"] == NAMESPACE
        })
}

/// (scope, group, resource, verb) for every verb `rbac.yaml` grants the ServiceAccount
/// through the roles it binds it to (a role bound to no one, say a metrics reader for
/// Prometheus, is not the account's); fails on a form the table cannot state (wildcards,
/// resourceNames, non-resource URLs, aggregation).
fn granted(docs: &[Value]) -> Result<BTreeSet<(Scope, String, String, String)>> {
    let bound: Vec<(&Value, &Value)> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .filter(|d| binds_the_account(d))
        .map(|d| (&d["roleRef"]["kind"], &d["roleRef"]["name"]))
        .collect();
    let mut out = BTreeSet::new();
    for doc in docs {
        let scope = match (doc["kind"].as_str(), doc["metadata"]["namespace"].as_str()) {
            (Some("ClusterRole"), None) => Scope::Cluster,
            (Some("Role"), Some(NAMESPACE)) => Scope::Own,
            (Some("Role"), other) => bail!("a Role outside {NAMESPACE}: {other:?}"),
            _ => continue,
        };
        if !bound.contains(&(&doc["kind"], &doc["metadata"]["name"])) {
            continue;
        }
        ensure!(
            doc.get("aggregationRule").is_none(),
            "no aggregation: {doc}"
        );
        for rule in doc["rules"].as_array().context("rules")? {
            ensure!(
                rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
                "a form the table cannot state: {rule}"
            );
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        ensure!(
                            ![&group, &resource, &verb].contains(&&"*".to_owned()),
                            "a wildcard: {rule}"
                        );
                        out.insert((scope, group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
    }
    Ok(out)
}

#[test]
fn the_manifests_grant_exactly_the_table() -> Result<()> {
    let docs = documents("rbac.yaml")?;
    let granted = granted(&docs)?;
    let table = table();
    let unstated: Vec<_> = granted.difference(&table).collect();
    let stale: Vec<_> = table.difference(&granted).collect();
    assert!(
        unstated.is_empty(),
        "rbac.yaml grants rights NEEDS does not state (add a row with who needs it and why, \
         or remove the rule): {unstated:#?}"
    );
    assert!(
        stale.is_empty(),
        "NEEDS states rights rbac.yaml does not grant: {stale:#?}"
    );
    // Every (scope, group, resource) is one row.
    let rows: BTreeSet<_> = NEEDS
        .iter()
        .map(|n| (n.scope, n.group, n.resource))
        .collect();
    assert_eq!(rows.len(), NEEDS.len(), "one row per resource");
    Ok(())
}

#[test]
fn one_service_account_serves_both_containers_and_only_it_is_bound() -> Result<()> {
    let docs = documents("rbac.yaml")?;
    let accounts: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ServiceAccount")
        .collect();
    assert_eq!(accounts.len(), 1, "one ServiceAccount");
    assert_eq!(accounts[0]["metadata"]["name"], ACCOUNT);
    assert_eq!(accounts[0]["metadata"]["namespace"], NAMESPACE);
    // Every binding of the account binds it alone to a role of this file (nothing built in,
    // like cluster-admin or view): two ClusterRoles cluster-wide and a Role in capt-system.
    let subject =
        serde_json::json!([{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]);
    let mut bound = Vec::new();
    for binding in docs.iter().filter(|d| binds_the_account(d)) {
        assert_eq!(binding["subjects"], subject, "{binding}");
        let role_kind = match binding["kind"].as_str() {
            Some("ClusterRoleBinding") => "ClusterRole",
            Some("RoleBinding") => "Role",
            other => panic!("{other:?} binds the account"),
        };
        assert_eq!(binding["roleRef"]["kind"], role_kind, "{binding}");
        assert!(
            docs.iter().any(|d| d["kind"] == role_kind
                && d["metadata"]["name"] == binding["roleRef"]["name"]
                && d["metadata"]["namespace"] == binding["metadata"]["namespace"]),
            "it binds a role of this file, nothing built in: {binding}"
        );
        bound.push(role_kind);
    }
    bound.sort_unstable();
    // capt-controller and capt-controller-metrics-auth; the leader-election Role.
    assert_eq!(bound, ["ClusterRole", "ClusterRole", "Role"]);
    // The Deployment: both containers in one pod, under that account.
    let deployment = &documents("deployment.yaml")?[0];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], ACCOUNT);
    let containers: Vec<&str> = pod["containers"]
        .as_array()
        .context("containers")?
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(containers, ["status-applier", "manager"]);
    Ok(())
}

#[test]
fn the_docs_list_the_table() -> Result<()> {
    let docs = std::fs::read_to_string(repo_root().join("docs/security.md"))?;
    // | group | resource | scope | verbs | who | why |
    let rows: BTreeSet<[String; 5]> = docs
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().replace('`', ""))
                .collect();
            std::array::from_fn(|i| cells.get(i).cloned().unwrap_or_default())
        })
        .collect();
    let wanted: BTreeSet<[String; 5]> = NEEDS
        .iter()
        .map(|n| {
            [
                if n.group.is_empty() { "core" } else { n.group }.to_owned(),
                n.resource.to_owned(),
                n.scope.as_str().to_owned(),
                n.verbs.join(", "),
                n.who.as_str().to_owned(),
            ]
        })
        .collect();
    assert_eq!(
        rows, wanted,
        "docs/security.md's RBAC table and NEEDS differ"
    );
    assert!(NEEDS.iter().all(|n| !n.why.is_empty()));
    Ok(())
}

/// Whether the API server would allow the ServiceAccount `verb` on `group`/`resource` in
/// `namespace` (`""`: every namespace), asked with a SubjectAccessReview carrying the user and
/// groups of the account's token.
async fn allowed(
    reviews: &Api<SubjectAccessReview>,
    namespace: &str,
    group: &str,
    resource: &str,
    verb: &str,
) -> Result<bool> {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{NAMESPACE}:{ACCOUNT}")),
            groups: Some(vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{NAMESPACE}"),
                "system:authenticated".to_owned(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                verb: Some(verb.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = reviews.create(&PostParams::default(), &review).await?;
    Ok(answer.status.context("a review has a status")?.allowed)
}

#[tokio::test]
async fn the_api_server_allows_exactly_the_table_and_none_of_the_forbidden() -> Result<()> {
    capt_tests::install_rbac()?;
    // RBAC changes reach the authorizer through its informers: wait for the table's first
    // right before judging.
    let reviews: Api<SubjectAccessReview> = Api::all(env().client().await?);
    let first = &NEEDS[0];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !allowed(&reviews, "", first.group, first.resource, first.verbs[0]).await? {
        ensure!(
            std::time::Instant::now() < deadline,
            "the manifests' RBAC never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    let other = "some-tenant";
    let mut wrong = Vec::new();
    let mut checked = 0;
    for n in NEEDS {
        let (inside, outside): (&[&str], &[&str]) = match n.scope {
            Scope::Cluster => (&["", other, NAMESPACE], &[]),
            Scope::Own => (&[NAMESPACE], &["", other]),
        };
        for verb in VERBS {
            let granted = n.verbs.contains(verb);
            for ns in inside {
                checked += 1;
                if allowed(&reviews, ns, n.group, n.resource, verb).await? != granted {
                    wrong.push(format!(
                        "{verb} {}/{} in {ns:?}: want allowed={granted} ({})",
                        n.group, n.resource, n.why
                    ));
                }
            }
            for ns in outside {
                checked += 1;
                if allowed(&reviews, ns, n.group, n.resource, verb).await? {
                    wrong.push(format!(
                        "{verb} {}/{} in {ns:?}: allowed outside {NAMESPACE}",
                        n.group, n.resource
                    ));
                }
            }
        }
    }
    for (ns, group, resource, verbs, why) in MUST_NOT {
        for verb in *verbs {
            checked += 1;
            if allowed(&reviews, ns, group, resource, verb).await? {
                wrong.push(format!(
                    "{verb} {group}/{resource} in {ns:?} allowed: {why}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} wrong answers: {wrong:#?}",
        wrong.len()
    );
    assert!(checked > 300, "{checked} reviews");
    Ok(())
}
