//! The controller's own writes (finalizers, Workspaces, kubeconfig Secrets) fenced by its
//! Lease, as the status-applier's are: a leader cut off from the API server (a proxy holds
//! every request it sends, while the API server's answers and watch events still arrive)
//! cannot renew its Lease, and stops writing at its deadline, the renew time plus the
//! duration less the margin the status-applier stops at: before the Lease expires and
//! another replica may take it, so no write of the old leader is sent beside the new one's.
//! It does not exit: when its requests flow again it stands by while another replica holds
//! the Lease, writing nothing (none of the writes it was asked for meanwhile was sent), and
//! leads again, and writes them, once the other lets go.

use anyhow::{Context, Result, ensure};
use capt_controller::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster};
use capt_tests::audit_log::AuditLog;
use capt_tests::held_proxy::HeldProxy;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant, SystemTime};

/// A lease of 6 s renewed every second: the leader stops writing 1.2 s before it expires.
const LEASE: &[&str] = &[
    "--lease-duration-seconds",
    "6",
    "--lease-renew-period-seconds",
    "1",
    "--lease-retry-period-seconds",
    "1",
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
async fn a_leader_cut_off_from_the_api_server_stops_writing_before_its_lease_expires_and_leads_again()
-> Result<()> {
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
    loop {
        ensure!(
            system.controller_exited()?.is_none(),
            "the controller exited: a lapsed lead must not restart it:\n{}",
            system.controller_log_text()
        );
        if system
            .controller_log_text()
            .contains("not renewed before its deadline")
        {
            break;
        }
        // Read each time: a renewal sent just before the hold may land after it.
        let expires = expiry(&leases).await?;
        ensure!(
            SystemTime::now() < expires,
            "the controller still writes past its Lease's expiry, when another replica may \
             take the Lease:\n{}",
            system.controller_log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "stopped writing {:.1} s after its requests were held",
        held.elapsed().as_secs_f64()
    );

    // A CAPTCluster created now (by the test, not through the proxy) reaches the controller
    // through its watch. A write for it sent now would be held by the proxy and land the
    // moment it lets go. Meanwhile the Lease expires and another replica takes it (the test
    // writes its claim), so the controller must stand by when its requests flow again, and
    // write nothing until it leads again once the other lets go.
    let mut during = cc.clone();
    during.metadata.name = Some("during".into());
    api.create(&PostParams::default(), &during).await?;
    let expired = expiry(&leases).await?;
    while SystemTime::now() < expired {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = MicroTime(jiff::Timestamp::now());
    let claim = json!({"spec": {"holderIdentity": "another-replica", "renewTime": now, "leaseDurationSeconds": 3600}});
    leases
        .patch(
            "capt-controller",
            &PatchParams::default(),
            &Patch::Merge(claim),
        )
        .await?;
    let since_the_release = AuditLog::from_now()?;
    proxy.release();
    system
        .wait_for(
            "the controller to stand by for the other replica",
            Duration::from_secs(30),
            || async {
                Ok(system
                    .controller_log_text()
                    .contains("Standing by: another replica leads"))
            },
        )
        .await?;
    // From here on the controller may lead again: what it wrote before, it sent while it
    // did not lead.
    let unclaimed = jiff::Timestamp::now();
    let unclaim = json!({"spec": {"holderIdentity": null}});
    leases
        .patch(
            "capt-controller",
            &PatchParams::default(),
            &Patch::Merge(unclaim),
        )
        .await?;
    system
        .wait_for(
            "the controller to lead again",
            Duration::from_secs(30),
            || async { Ok(system.controller_log_text().matches("Leading").count() == 2) },
        )
        .await?;
    let before_it_led_again: Vec<_> = (since_the_release.writes_in(&ns.name)?)
        .into_iter()
        // Of the object created after its deadline: a write for "before" may have been sent
        // before the deadline, held by the proxy, and landed after it, as a write in flight
        // at a deadline may.
        .filter(|w| w.manager.contains("capt") && w.name == "during")
        .filter(|w| {
            w.received
                .parse::<jiff::Timestamp>()
                .is_ok_and(|received| received < unclaimed)
        })
        .collect();
    ensure!(
        before_it_led_again.is_empty(),
        "the controller wrote while another replica held the Lease (writes it sent while it \
         did not lead): {before_it_led_again:#?}\n{}",
        system.controller_log_text()
    );
    system
        .wait_for(
            "the finalizer on the CAPTCluster created while it did not lead",
            Duration::from_secs(30),
            || async {
                let finalizers = api.get("during").await?.metadata.finalizers;
                Ok(finalizers.is_some_and(|f| f.iter().any(|f| f == CAPT_CLUSTER_FINALIZER)))
            },
        )
        .await?;
    ensure!(
        system.controller_exited()?.is_none(),
        "the controller is still the same process"
    );

    // The namespace goes with its objects.
    let unfinalized = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for name in ["before", "during"] {
        api.patch(name, &PatchParams::default(), &unfinalized)
            .await?;
    }
    Ok(())
}
