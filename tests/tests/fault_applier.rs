//! The status-applier killed and restarted in the middle of a burst of Workspace rewrites:
//! nothing is lost (the last rewrite reaches the control plane), the control plane's status
//! is what it was but for what the new revision changes (no field dropped, emptied or
//! changed), and after catching up it writes nothing more.

use anyhow::Result;
use capt_tests::system::System;
use capt_tests::{TestNamespace, differences, env, without_paths};
use serde_json::Value;
use std::time::Duration;

/// What a new Workspace revision changes in the control plane's status, and only that: the
/// checksum of the fake provider's apply of the revision, as the Workspace's `atProvider`
/// mirror and as its WorkspaceTemplateApply's `lastAppliedRevision`.
const CHANGED_BY_A_REVISION: &[&str] = &[
    "status.workspaceStatus.atProvider.checksum",
    "status.workspaceTemplateStatus.lastAppliedRevision",
];

/// Asserts that the control plane's status `after` is `before` but for the fields a new
/// revision changes: no field dropped, none emptied, none with another value.
fn assert_same_status_but_the_revision(before: &Value, after: &Value) {
    let before = without_paths(before, CHANGED_BY_A_REVISION);
    let after = without_paths(after, CHANGED_BY_A_REVISION);
    assert!(
        before["status"].is_object(),
        "the control plane has a status: {before}"
    );
    assert_eq!(
        after["status"],
        before["status"],
        "the status changed beyond {CHANGED_BY_A_REVISION:?}: {:#?}",
        differences(&before["status"], &after["status"])
    );
}

/// How long the applier must write nothing once the stack is at rest.
const QUIET: Duration = Duration::from_secs(5);

#[tokio::test]
async fn an_applier_killed_mid_burst_loses_nothing_and_settles() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-applier").await?;
    let mut system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let before = system.get(&["captcontrolplane", "demo"])?.unwrap();

    for revision in 1..=6 {
        system.set_revision(&format!("r{revision}"))?;
        if revision == 3 {
            system.applier.restart().await?; // SIGKILL, then a new process on the same socket
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    system.wait_mirrored("r6", Duration::from_secs(60)).await?;
    let after = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_same_status_but_the_revision(&before, &after);
    assert_eq!(after["status"]["phase"], "Ready");
    let cluster = system.get(&["cluster", "demo"])?.unwrap();
    assert_eq!(cluster["status"]["phase"], "Provisioned");
    assert!(cluster["spec"]["controlPlaneEndpoint"]["host"].is_string());

    // Caught up: the whole stack at rest (what the quiet window starts after, not a time).
    system.wait_samples_rest().await?;
    let writes = system
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    // The claim's own window: nothing is written over it.
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        system
            .applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes,
        "no more writes once caught up"
    );
    println!("after the restart: {writes} writes to catch up, then none");
    Ok(())
}

#[tokio::test]
async fn intents_queued_when_the_applier_is_killed_are_applied_after_the_restart() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-inflight").await?;
    // A 2 s coalescing window holds the intents of a new revision in the applier, accepted
    // and not yet applied, long enough to kill it with them queued.
    let window = ["--coalesce-window-ms", "2000"];
    let mut system = System::start_tuned(&ns.name, 20, &[], &window, &env().kubeconfig).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let before = system.get(&["captcontrolplane", "demo"])?.unwrap();

    system.set_revision("in-flight")?;
    system
        .wait_for(
            "the new revision's intents queued in the applier",
            Duration::from_secs(10),
            || async {
                Ok(system
                    .applier
                    .metric("status_applier_pending_documents", &[])
                    .await?
                    > 0.0)
            },
        )
        .await?;
    assert!(
        !system.mirrors_revision("in-flight")?,
        "the revision must still be in flight when the applier is killed"
    );
    system.applier.restart().await?;
    system
        .wait_mirrored("in-flight", Duration::from_secs(30))
        .await?;
    let after = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_same_status_but_the_revision(&before, &after);
    assert_eq!(after["status"]["phase"], "Ready");
    Ok(())
}
