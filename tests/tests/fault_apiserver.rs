//! The API server stopped for 10 s and restarted, with the Lease timing the Deployment ships:
//! the status-applier's readiness shows the outage, and both processes carry on afterwards
//! without being restarted. (This test stops
//! the shared API server, so it lives alone in its own test binary.)

use anyhow::Result;
use capt_tests::api_server_fault::ApiServerFault;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use std::time::{Duration, Instant};

/// The longest wait of kube-rs's watcher between two tries of a failed watch
/// (`WatchStreamExt::default_backoff`).
const WATCH_MOST_BACKOFF: Duration = Duration::from_secs(30);
/// How long a watch of the test's few objects may take to list again, on a loaded machine.
const RELIST: Duration = Duration::from_secs(15);

#[tokio::test]
async fn both_processes_recover_from_a_10_second_api_server_outage_without_restarting() -> Result<()>
{
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-apiserver").await?;
    // The Lease as shipped (15 s, renewed every 5 s): the outage and the API server's
    // restart outlast it, so the controller's lead lapses; it stops writing and stands as a
    // candidate, takes the Lease again once the API server is back (nobody else wants it),
    // and goes on without a restart.
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    assert_eq!(
        system.applier.client.get("/readyz").await?.status.as_u16(),
        200
    );

    let outage = ApiServerFault::stop()?;
    let stopped = Instant::now();
    let mut saw_outage = String::new();
    while stopped.elapsed() < Duration::from_secs(10) {
        let ready = system.applier.client.get("/readyz").await?;
        if ready.status.as_u16() == 503 && saw_outage.is_empty() {
            saw_outage = ready.body;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("readiness during the outage: {saw_outage}");
    assert!(
        !saw_outage.is_empty(),
        "the applier's /readyz showed the outage"
    );
    outage.end()?;

    // Ready once each of its watches has listed again. kube-rs's watcher retries a failed
    // watch with a backoff of up to 30 s (`default_backoff`), so the first retry after the
    // API server is back may come 30 s later, and the relist after it: the bound is that,
    // not how fast a watch happens to come back.
    system
        .wait_for(
            "the applier ready again",
            WATCH_MOST_BACKOFF + RELIST,
            || async { Ok(system.applier.client.get("/readyz").await?.status.as_u16() == 200) },
        )
        .await?;
    // Both processes (never restarted) still do their work: a new Workspace rewrite reaches
    // the control plane.
    let ws = capt_controller::render::workspace_name(&ns.name, "demo-controlplane");
    system
        .wait_for(
            "the annotation accepted",
            Duration::from_secs(30),
            || async {
                Ok(env()
                    .kubectl_run(
                        &[
                            "annotate",
                            "workspace",
                            &ws,
                            "--overwrite",
                            "fake.tf.upbound.io/revision=after-outage",
                        ],
                        None,
                    )?
                    .status
                    .success())
            },
        )
        .await?;
    system
        .wait_mirrored("after-outage", Duration::from_secs(60))
        .await?;
    assert!(
        system
            .controller_metric("capt_reconciles_total", &[])
            .await?
            > 0.0,
        "the controller answers"
    );
    let mut system = system;
    assert_eq!(
        system.controller_exited()?,
        None,
        "the controller was not restarted:\n{}",
        system.controller_log_text()
    );
    Ok(())
}
