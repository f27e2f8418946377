//! The API server client both binaries use: the configuration kube infers (kubeconfig, else
//! in-cluster), with a `User-Agent` naming the program and its version. kube sends none by
//! default, so without it the API server's audit log (and API Priority and Fairness) cannot
//! tell the controller's requests from the status-applier's or anyone else's.
//!
//! Every response passes [`crate::guard`]: an object nested too deep or too large for the
//! program reaches it as a stub that says so, and fails neither its list page nor its watch.

use anyhow::Context as _;
use axum::http::{HeaderValue, header};

/// A client for `program` at `version` (`capt-controller/0.1.0` in the audit log).
pub async fn kube_client(program: &str, version: &str) -> anyhow::Result<kube::Client> {
    Ok(builder(program, version).await?.build())
}

/// [`kube_client`] whose writes are refused while `may_write` says no ([`crate::fence`]).
pub async fn kube_client_fenced(
    program: &str,
    version: &str,
    may_write: crate::fence::MayWrite,
) -> anyhow::Result<kube::Client> {
    let fence = crate::fence::FenceLayer::new(may_write);
    Ok(builder(program, version).await?.with_layer(&fence).build())
}

/// What kube's builder makes of a configuration (its `GenericService`, which it does not name).
type Inferred = tower::util::BoxService<
    axum::http::Request<kube::client::Body>,
    axum::http::Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;

async fn builder(
    program: &str,
    version: &str,
) -> anyhow::Result<kube::client::ClientBuilder<crate::guard::Guard<Inferred>>> {
    let mut config = kube::Config::infer()
        .await
        .context("finding the API server (kubeconfig or in-cluster)")?;
    let agent = HeaderValue::from_str(&format!("{program}/{version}"))
        .context("a User-Agent from the program's name")?;
    config.headers.push((header::USER_AGENT, agent));
    let builder =
        kube::client::ClientBuilder::try_from(config).context("connecting to the API server")?;
    Ok(builder.with_layer(&crate::guard::GuardLayer))
}
