//! The controller's own writes (finalizers, Workspaces, kubeconfig Secrets) fenced by its
//! Lease, as the status-applier's are: a leader cut off from the API server (a proxy holds
//! every request it sends, while the API server's answers and watch events still arrive)
//! cannot renew its Lease, and stops at its deadline, the renew time plus the duration less
//! the margin the status-applier stops at: before the Lease expires and another replica may
//! take it, so no write of the old leader is sent beside the new one's.

use anyhow::{Context, Result, ensure};
use capt_controller::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster};
use capt_tests::held_proxy::HeldProxy;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant, SystemTime};

/// A lease of 6 s renewed 2 s before it expires: the leader stops writing 1.2 s before.
const LEASE: &[&str] = &[
    "--lease-duration-seconds",
    "6",
    "--lease-grace-seconds",
    "2",
];

/// When the Lease expires, by the last renewal the API server has.
async fn expiry(leases: &Api<Lease>) -> Result<SystemTime> {
    let spec = leases.get("capt-controller").await?.spec;
    let spec = spec.context("the Lease has a spec")?;
    let renewed: SystemTime = spec.renew_time.context("the Lease was renewed")?.0.into();
    let duration = spec.lease_duration_seconds.context("a duration")?;
    Ok(renewed + Duration::from_secs(u64::try_from(duration)?))
}

#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_before_its_lease_expires() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "lease-fence").await?;
    let proxy = HeldProxy::in_front_of(&env().kubeconfig).await?;
    let mut system = System::start_tuned(&ns.name, 20, LEASE, &[], proxy.kubeconfig()).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let api: Api<CAPTCluster> = Api::namespaced(client.clone(), &ns.name);

    // It leads and writes: a new CAPTCluster gets its finalizer.
    let cc: CAPTCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "before"},
        "spec": {"region": "ap-northeast-1", "existingVpcId": "vpc-0123456789abcdef0"},
    }))?;
    api.create(&PostParams::default(), &cc).await?;
    system
        .wait_for(
            "the leader's finalizer on a new CAPTCluster",
            Duration::from_secs(30),
            || async {
                let finalizers = api.get("before").await?.metadata.finalizers;
                Ok(finalizers.is_some_and(|f| f.iter().any(|f| f == CAPT_CLUSTER_FINALIZER)))
            },
        )
        .await?;

    proxy.hold();
    let held = Instant::now();
    let status = loop {
        if let Some(status) = system.controller_exited()? {
            break status;
        }
        // Read each time: a renewal sent just before the hold may land after it.
        let expires = expiry(&leases).await?;
        ensure!(
            SystemTime::now() < expires,
            "the controller still runs past its Lease's expiry, when another replica may take \
             the Lease:\n{}",
            system.controller_log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "stopped {:.1} s after its requests were held",
        held.elapsed().as_secs_f64()
    );
    assert_eq!(
        status.code(),
        Some(1),
        "it exits to be restarted as a candidate"
    );
    let log = system.controller_log_text();
    assert!(log.contains("not renewed before its deadline"), "{log}");

    // The namespace goes with its objects: the finalizer of the stopped leader comes off.
    let unfinalized = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch("before", &PatchParams::default(), &unfinalized)
        .await?;
    Ok(())
}
