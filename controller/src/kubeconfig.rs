//! The Cluster's `<cluster>-kubeconfig` Secret of the Cluster API control-plane contract, as a
//! pure function of the control plane's connection Secret (every Terraform output, sensitive
//! ones included, as provider-terraform writes them).
//!
//! Nothing here logs, and nothing here puts a Secret value into an error: the only outputs are
//! the bytes to store and whether the live Secret needs a write.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::json;
use std::collections::BTreeMap;

/// The Secret type Cluster API gives the Secrets it reads (`clusterv1.ClusterSecretType`).
pub const SECRET_TYPE: &str = "cluster.x-k8s.io/secret";
/// The data key holding the kubeconfig (`secret.KubeconfigDataName`).
pub const VALUE_KEY: &str = "value";
/// The connection Secret key of a kubeconfig the Terraform module outputs itself.
pub const KUBECONFIG_OUTPUT: &str = "kubeconfig";
/// The connection Secret key of the EKS API server endpoint.
pub const ENDPOINT_OUTPUT: &str = "cluster_endpoint";
/// The connection Secret key of the cluster's CA bundle (base64 PEM, as terraform-aws-eks
/// outputs it).
pub const CA_OUTPUT: &str = "cluster_certificate_authority_data";
/// The connection Secret key of the EKS cluster's name.
pub const NAME_OUTPUT: &str = "cluster_name";
/// The connection Secret key of a bearer token for the cluster's API server (a sensitive
/// output: for instance a ServiceAccount token the module creates in the cluster). With it
/// the kubeconfig needs no `aws` CLI, so Cluster API core can use it (`docs/cluster-api.md`,
/// "The kubeconfig Secret core connects with").
pub const TOKEN_OUTPUT: &str = "cluster_token";

/// The name of a Cluster's kubeconfig Secret: `<cluster>-kubeconfig`.
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-kubeconfig")
}

/// The name of a Cluster's kubeconfig Secret for people: `<cluster>-user-kubeconfig`, as
/// Cluster API Provider AWS names the exec-form kubeconfig it writes beside the one core uses.
pub fn user_secret_name(cluster: &str) -> String {
    format!("{cluster}-user-kubeconfig")
}

/// The kubeconfig to store for `cluster`, from the connection Secret's `data`: its
/// `kubeconfig` output verbatim; else one generated from `cluster_endpoint` and
/// `cluster_certificate_authority_data` that authenticates with the `cluster_token` output
/// when there is one (usable by Cluster API core, which runs no exec plugin), else with
/// `aws eks get-token` (for the `cluster_name` output, else `eks_name`, the name the apply
/// passed to Terraform, in `region` when known; for people, core cannot connect with it);
/// else `None`, nothing to write yet. No other key is ever read.
pub fn kubeconfig(
    data: &BTreeMap<String, ByteString>,
    cluster: &str,
    eks_name: &str,
    region: Option<&str>,
) -> Option<Vec<u8>> {
    if let Some(verbatim) = data.get(KUBECONFIG_OUTPUT).filter(|v| !v.0.is_empty()) {
        return Some(verbatim.0.clone());
    }
    let server = Server::of(data, eks_name)?;
    let credentials = match text(data, TOKEN_OUTPUT) {
        Some(token) => json!({"token": token}),
        None => aws_exec(&server.eks_name, region),
    };
    // Named as Cluster API core names its own kubeconfigs (util/kubeconfig.New).
    render(cluster, &format!("{cluster}-admin"), &server, credentials)
}

/// The kubeconfig for people (`<cluster>-user-kubeconfig`): from `cluster_endpoint` and
/// `cluster_certificate_authority_data`, a user that runs `aws eks get-token` with the
/// person's own AWS credentials, never the token core gets; `None` until both outputs exist
/// (a module that outputs only a whole `kubeconfig` gets no user kubeconfig).
pub fn user_kubeconfig(
    data: &BTreeMap<String, ByteString>,
    cluster: &str,
    eks_name: &str,
    region: Option<&str>,
) -> Option<Vec<u8>> {
    let server = Server::of(data, eks_name)?;
    let credentials = aws_exec(&server.eks_name, region);
    render(cluster, &format!("{cluster}-user"), &server, credentials)
}

/// The trimmed, non-empty text of an output.
fn text<'a>(data: &'a BTreeMap<String, ByteString>, key: &str) -> Option<&'a str> {
    data.get(key)
        .and_then(|v| std::str::from_utf8(&v.0).ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The EKS API server as the outputs tell it.
struct Server {
    url: String,
    ca: String,
    eks_name: String,
}

impl Server {
    fn of(data: &BTreeMap<String, ByteString>, eks_name: &str) -> Option<Self> {
        let endpoint = text(data, ENDPOINT_OUTPUT)?;
        let ca = text(data, CA_OUTPUT)?;
        let url = if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("https://{endpoint}")
        };
        Some(Self {
            url,
            ca: ca.to_owned(),
            eks_name: text(data, NAME_OUTPUT).unwrap_or(eks_name).to_owned(),
        })
    }
}

/// A user that authenticates with `aws eks get-token`.
fn aws_exec(eks_name: &str, region: Option<&str>) -> serde_json::Value {
    let mut args = vec!["eks", "get-token", "--cluster-name", eks_name];
    if let Some(region) = region {
        args.extend(["--region", region]);
    }
    json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "aws",
        "args": args,
    }})
}

fn render(
    cluster: &str,
    user: &str,
    server: &Server,
    credentials: serde_json::Value,
) -> Option<Vec<u8>> {
    let context = format!("{user}@{cluster}");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server.url, "certificate-authority-data": server.ca}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": context, "context": {"cluster": cluster, "user": user}}],
        "current-context": context,
    });
    serde_yaml::to_string(&config).ok().map(String::into_bytes)
}

/// The controller owner reference Cluster API's KubeadmControlPlane puts on the Secret
/// (`metav1.NewControllerRef`): controller and blocking its owner's deletion.
pub fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The Secret to apply: `name` (`<cluster>-kubeconfig` or `<cluster>-user-kubeconfig`) in
/// `namespace`, of type `cluster.x-k8s.io/secret`, labelled with the cluster's name,
/// controlled by `owner`, with the kubeconfig under `value` and nothing else.
pub fn desired_secret(
    name: &str,
    cluster: &str,
    namespace: &str,
    owner: OwnerReference,
    kubeconfig: Vec<u8>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                crate::render::CLUSTER_NAME_LABEL.to_owned(),
                cluster.to_owned(),
            )])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.to_owned()),
        data: Some(BTreeMap::from([(
            VALUE_KEY.to_owned(),
            ByteString(kubeconfig),
        )])),
        ..Secret::default()
    }
}

/// What to do about the live Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretAction {
    /// It already holds what we want: no write.
    UpToDate,
    /// It is missing, or our type, label, owner reference or value differ: apply.
    Write,
    /// It exists with another type: a user-provided kubeconfig (a Secret's type cannot
    /// change, and Cluster API providers leave such Secrets alone). No write.
    UserProvided,
    /// It exists with our type but this control plane is not its controller (no controller
    /// owner reference with the desired owner's uid): someone else's Secret, perhaps another
    /// control plane's. No write: a Secret is taken only when it is absent. What controls it.
    NotControlled(Option<String>),
}

/// The controller owner reference of `secret`, if it has one.
fn controller_of(secret: &Secret) -> Option<&OwnerReference> {
    let refs = secret.metadata.owner_references.iter().flatten();
    refs.into_iter().find(|o| o.controller == Some(true))
}

/// Compares the live Secret with the desired one. A Secret of our type is ours only when
/// the desired owner is its controller. Only what we apply counts: labels, owner references
/// and data keys others added do not make a write.
pub fn verdict(live: Option<&Secret>, desired: &Secret) -> SecretAction {
    let Some(live) = live else {
        return SecretAction::Write;
    };
    if live.type_ != desired.type_ {
        return SecretAction::UserProvided;
    }
    let ours = desired.metadata.owner_references.iter().flatten();
    let live_controller = controller_of(live);
    if !ours
        .into_iter()
        .any(|o| live_controller.is_some_and(|l| l.uid == o.uid))
    {
        let shown = live_controller.map(|l| format!("{} {} (uid {})", l.kind, l.name, l.uid));
        return SecretAction::NotControlled(shown);
    }
    let labels_present = desired.metadata.labels.iter().flatten().all(|(k, v)| {
        live.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(k))
            .is_some_and(|l| l == v)
    });
    let owners_present = desired.metadata.owner_references.iter().flatten().all(|o| {
        live.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|l| l == o)
    });
    let data_present = desired.data.iter().flatten().all(|(k, v)| {
        live.data
            .as_ref()
            .and_then(|d| d.get(k))
            .is_some_and(|l| l == v)
    });
    if labels_present && owners_present && data_present {
        SecretAction::UpToDate
    } else {
        SecretAction::Write
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET_VALUE: &str = "do-not-leak-3f9a";

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect()
    }

    /// The outputs of an EKS module: endpoint `x.eks.amazonaws.com`, CA `Q0E=`, name
    /// `demo-eks`, and `more`.
    fn eks_outputs(more: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
        let mut d = data(&[
            ("cluster_endpoint", "https://x.eks.amazonaws.com"),
            ("cluster_certificate_authority_data", "Q0E="),
            ("cluster_name", "demo-eks"),
        ]);
        d.extend(data(more));
        d
    }

    /// The kubeconfig of [`eks_outputs`] for `user`, authenticating with `aws eks get-token`
    /// in `ap-northeast-1`.
    fn aws_exec_kubeconfig(user: &str) -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "demo", "cluster": {
                "server": "https://x.eks.amazonaws.com", "certificate-authority-data": "Q0E="}}],
            "users": [{"name": user, "user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": "aws",
                "args": ["eks", "get-token", "--cluster-name", "demo-eks", "--region", "ap-northeast-1"],
            }}}],
            "contexts": [{"name": format!("{user}@demo"), "context": {"cluster": "demo", "user": user}}],
            "current-context": format!("{user}@demo"),
        })
    }

    fn owner() -> OwnerReference {
        controller_ref(
            "controlplane.cluster.x-k8s.io/v1beta1",
            "CAPTControlPlane",
            "demo",
            "uid-1",
        )
    }

    #[test]
    fn a_kubeconfig_output_is_used_verbatim() {
        let d = eks_outputs(&[("kubeconfig", "apiVersion: v1\nkind: Config\n")]);
        assert_eq!(
            kubeconfig(&d, "demo", "demo", Some("ap-northeast-1")).unwrap(),
            b"apiVersion: v1\nkind: Config\n"
        );
    }

    #[test]
    fn endpoint_and_ca_give_an_aws_exec_kubeconfig() {
        // The CA as a module may output it, with a trailing newline.
        let d = eks_outputs(&[("cluster_certificate_authority_data", "Q0E=\n")]);
        let bytes = kubeconfig(&d, "demo", "demo", Some("ap-northeast-1")).unwrap();
        let config: serde_json::Value = serde_yaml::from_slice(&bytes).unwrap();
        assert_eq!(config, aws_exec_kubeconfig("demo-admin"));
        // Stable: the same outputs give the same bytes, so an unchanged Secret is not rewritten.
        assert_eq!(
            kubeconfig(&d, "demo", "demo", Some("ap-northeast-1")).unwrap(),
            bytes
        );
    }

    #[test]
    fn a_token_output_gives_a_token_kubeconfig_core_can_use() {
        let d = eks_outputs(&[
            ("cluster_endpoint", "https://127.0.0.1:6443"),
            ("cluster_token", "tok-123\n"),
        ]);
        let bytes = kubeconfig(&d, "demo", "demo", Some("ap-northeast-1")).unwrap();
        let config: serde_json::Value = serde_yaml::from_slice(&bytes).unwrap();
        assert_eq!(
            config["users"],
            json!([{"name": "demo-admin", "user": {"token": "tok-123"}}]),
            "a bearer token and no exec plugin"
        );
        assert_eq!(
            config["clusters"][0]["cluster"],
            json!({"server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E="})
        );
        // The token alone, without the endpoint and the CA, makes no kubeconfig.
        assert_eq!(
            kubeconfig(&data(&[("cluster_token", "tok-123")]), "demo", "demo", None),
            None
        );
    }

    #[test]
    fn without_a_name_output_or_region_the_applys_cluster_name_is_used_and_no_region_given() {
        let d = data(&[
            ("cluster_endpoint", "x.eks.amazonaws.com"),
            ("cluster_certificate_authority_data", "Q0E="),
        ]);
        let config: serde_json::Value =
            serde_yaml::from_slice(&kubeconfig(&d, "demo", "ns_demo", None).unwrap()).unwrap();
        assert_eq!(
            config["users"][0]["user"]["exec"]["args"],
            json!(["eks", "get-token", "--cluster-name", "ns_demo"])
        );
        assert_eq!(
            config["clusters"][0]["name"], "demo",
            "named after the Cluster"
        );
        let user: serde_json::Value =
            serde_yaml::from_slice(&user_kubeconfig(&d, "demo", "ns_demo", None).unwrap()).unwrap();
        assert_eq!(
            user["users"][0]["user"]["exec"]["args"],
            json!(["eks", "get-token", "--cluster-name", "ns_demo"])
        );
        assert_eq!(
            config["clusters"][0]["cluster"]["server"],
            "https://x.eks.amazonaws.com"
        );
    }

    #[test]
    fn nothing_to_write_without_a_kubeconfig_or_both_endpoint_and_ca() {
        assert_eq!(kubeconfig(&data(&[]), "demo", "demo", None), None);
        let endpoint_only = data(&[
            ("cluster_endpoint", "https://x.eks.amazonaws.com"),
            ("cluster_name", "demo"),
        ]);
        assert_eq!(kubeconfig(&endpoint_only, "demo", "demo", None), None);
        let ca_only = data(&[("cluster_certificate_authority_data", "Q0E=")]);
        assert_eq!(kubeconfig(&ca_only, "demo", "demo", None), None);
        let empty_kubeconfig = data(&[("kubeconfig", "")]);
        assert_eq!(kubeconfig(&empty_kubeconfig, "demo", "demo", None), None);
    }

    #[test]
    fn the_user_kubeconfig_runs_aws_eks_get_token_and_never_carries_the_token() {
        let d = eks_outputs(&[
            ("cluster_token", SECRET_VALUE),
            ("kubeconfig", SECRET_VALUE),
        ]);
        let bytes = user_kubeconfig(&d, "demo", "demo", Some("ap-northeast-1")).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains(SECRET_VALUE));
        let config: serde_json::Value = serde_yaml::from_slice(&bytes).unwrap();
        assert_eq!(config, aws_exec_kubeconfig("demo-user"));
        assert_eq!(user_secret_name("demo"), "demo-user-kubeconfig");
        // Without the endpoint and the CA there is nothing to write, a whole `kubeconfig`
        // output notwithstanding (it is core's, with whatever credentials it holds).
        let verbatim_only = data(&[("kubeconfig", "apiVersion: v1\n")]);
        assert_eq!(user_kubeconfig(&verbatim_only, "demo", "demo", None), None);
    }

    #[test]
    fn other_keys_never_reach_the_kubeconfig_or_the_secret() {
        let others = [
            ("db_password", SECRET_VALUE),
            ("token", SECRET_VALUE),
            ("vpc_id", SECRET_VALUE),
        ];
        let generated = eks_outputs(&others);
        let mut verbatim = data(&others);
        verbatim.extend(data(&[("kubeconfig", "apiVersion: v1\n")]));
        for d in [generated, verbatim] {
            let bytes = kubeconfig(&d, "demo", "demo", Some("us-east-1")).unwrap();
            let text = String::from_utf8(bytes.clone()).unwrap();
            assert!(!text.contains(SECRET_VALUE), "{text}");
            let secret = desired_secret("demo-kubeconfig", "demo", "ns", owner(), bytes);
            let keys: Vec<&String> = secret.data.as_ref().unwrap().keys().collect();
            assert_eq!(keys, ["value"]);
        }
    }

    #[test]
    fn the_secret_follows_the_contract() {
        let secret = desired_secret("demo-kubeconfig", "demo", "ns", owner(), b"kc".to_vec());
        let v = serde_json::to_value(&secret).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "demo-kubeconfig", "namespace": "ns",
                    "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
                    "ownerReferences": [{"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                        "kind": "CAPTControlPlane", "name": "demo", "uid": "uid-1",
                        "controller": true, "blockOwnerDeletion": true}]},
                "type": "cluster.x-k8s.io/secret",
                "data": {"value": "a2M="},
            })
        );
    }

    #[test]
    fn only_a_difference_in_what_we_apply_makes_a_write() {
        let desired = desired_secret("demo-kubeconfig", "demo", "ns", owner(), b"kc".to_vec());
        assert_eq!(verdict(None, &desired), SecretAction::Write);
        assert_eq!(verdict(Some(&desired), &desired), SecretAction::UpToDate);

        // Others' labels, owners and keys, and server-set metadata, change nothing.
        let mut live = desired.clone();
        live.metadata.resource_version = Some("7".into());
        live.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "a".into());
        live.metadata
            .owner_references
            .as_mut()
            .unwrap()
            .push(OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "x".into(),
                uid: "uid-2".into(),
                ..OwnerReference::default()
            });
        live.data
            .as_mut()
            .unwrap()
            .insert("extra".into(), ByteString(b"x".to_vec()));
        assert_eq!(verdict(Some(&live), &desired), SecretAction::UpToDate);

        let mut changed = desired.clone();
        changed.data = Some(BTreeMap::from([(
            "value".into(),
            ByteString(b"old".to_vec()),
        )]));
        assert_eq!(verdict(Some(&changed), &desired), SecretAction::Write);
        let mut unlabelled = desired.clone();
        unlabelled.metadata.labels = None;
        assert_eq!(verdict(Some(&unlabelled), &desired), SecretAction::Write);
        let mut not_controller = desired.clone();
        not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(
            verdict(Some(&not_controller), &desired),
            SecretAction::NotControlled(None)
        );
        let mut other_owner_uid = desired.clone();
        other_owner_uid.metadata.owner_references.as_mut().unwrap()[0].uid = "uid-old".into();
        assert_eq!(
            verdict(Some(&other_owner_uid), &desired),
            SecretAction::NotControlled(Some("CAPTControlPlane demo (uid uid-old)".into()))
        );
        let mut unowned = desired.clone();
        unowned.metadata.owner_references = None;
        assert_eq!(
            verdict(Some(&unowned), &desired),
            SecretAction::NotControlled(None)
        );

        let mut opaque = desired.clone();
        opaque.type_ = Some("Opaque".into());
        assert_eq!(verdict(Some(&opaque), &desired), SecretAction::UserProvided);
    }
}
