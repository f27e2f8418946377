//! Who the processes are to the API server. As deployed, both containers run as the pod's
//! ServiceAccount (`capt-system/capt-controller`, `manifests/deploy/rbac.yaml`) with a
//! projected token; here each process gets a token of that ServiceAccount from the
//! TokenRequest API, in a kubeconfig of its own. Two tokens of one ServiceAccount are one
//! user with the same rights; the API server's audit log still tells them apart, by the
//! token's id (`user.extra["authentication.kubernetes.io/credential-id"]`, `JTI=<jti>`).
//!
//! The scraper of both metrics listeners is a ServiceAccount bound to
//! `capt-controller-metrics-reader`, as a Prometheus would be. The baseline (upstream's pattern) needs
//! rights the shipped RBAC does not give (it PUTs whole statuses): it runs as a
//! ServiceAccount of its own bound to `cluster-admin`.

use anyhow::{Context, Result};
use capt_tests::{env, install_rbac};
use serde_json::json;
use std::path::{Path, PathBuf};

/// The pod's ServiceAccount (the Deployment's `serviceAccountName`, in its namespace).
pub(crate) const POD_ACCOUNT: &str = "capt-controller";
const SCRAPER: &str = "capt-bench-scraper";
const BASELINE: &str = "capt-bench-baseline";

/// A token and where it is written as a kubeconfig.
pub(crate) struct Identity {
    pub(crate) kubeconfig: PathBuf,
    /// The token's id, as the audit log names it (`JTI=<jti>`).
    pub(crate) credential_id: String,
    pub(crate) token: String,
}

/// The namespace, RBAC and ServiceAccounts of the benchmark, in the running environment.
pub(crate) fn install(namespace: &str) -> Result<()> {
    install_rbac()?;
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": SCRAPER, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": SCRAPER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "capt-controller-metrics-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": BASELINE, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": BASELINE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": BASELINE, "namespace": namespace}]},
    ]});
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&objects.to_string()),
    )?;
    Ok(())
}

/// A new token of the pod's ServiceAccount.
pub(crate) fn pod(namespace: &str, dir: &Path, process: &str) -> Result<Identity> {
    token(namespace, POD_ACCOUNT, dir, process)
}

/// A new token of the baseline's ServiceAccount.
pub(crate) fn baseline(namespace: &str, dir: &Path) -> Result<Identity> {
    token(namespace, BASELINE, dir, "baseline")
}

/// A new token of the scraper's ServiceAccount.
pub(crate) fn scraper(namespace: &str, dir: &Path) -> Result<Identity> {
    token(namespace, SCRAPER, dir, "scraper")
}

fn token(namespace: &str, account: &str, dir: &Path, process: &str) -> Result<Identity> {
    let token = env()
        .kubectl_ok(
            &[
                "create",
                "token",
                account,
                "-n",
                namespace,
                "--duration",
                "48h",
            ],
            None,
        )?
        .trim()
        .to_owned();
    let jti = jwt_claim(&token, "jti")?;
    // The environment's kubeconfig (its server), with this token for its user.
    let text = std::fs::read_to_string(&env().kubeconfig)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    for u in config["users"]
        .as_sequence_mut()
        .context("kubeconfig has users")?
    {
        u["user"] = serde_yaml::to_value(json!({ "token": token }))?;
    }
    std::fs::create_dir_all(dir)?;
    let kubeconfig = dir.join(format!("kubeconfig-{process}"));
    std::fs::write(&kubeconfig, serde_yaml::to_string(&config)?)?;
    Ok(Identity {
        kubeconfig,
        credential_id: format!("JTI={jti}"),
        token,
    })
}

/// A string claim of a JWT's payload (not verified: our own API server just issued it).
fn jwt_claim(token: &str, claim: &str) -> Result<String> {
    let payload = token.split('.').nth(1).context("a JWT has a payload")?;
    let bytes = base64url(payload)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)?;
    v[claim]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("the token has no {claim}"))
}

/// Base64url without padding, decoded.
fn base64url(s: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            _ => anyhow::bail!("not base64url: {c}"),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64url_decodes() {
        assert_eq!(
            super::base64url("eyJqdGkiOiJhYiJ9").unwrap(),
            br#"{"jti":"ab"}"#
        );
    }
}
