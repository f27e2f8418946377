//! Two controller replicas on one Lease: only the leader reconciles and publishes; when it
//! dies, the other takes over within the lease duration.

use anyhow::Result;
use capt_tests::applier::{binary, metric_value};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LEASE: &[&str] = &[
    "--lease-duration-seconds",
    "4",
    "--lease-renew-period-seconds",
    "1",
    "--lease-retry-period-seconds",
    "1",
];

async fn metrics(addr: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    Ok(body)
}

#[tokio::test]
async fn only_the_leader_publishes_and_the_other_replica_takes_over_within_the_lease() -> Result<()>
{
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "leader").await?;
    let mut system = System::start_with(&ns.name, 50, LEASE).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;

    // A second replica: same Lease, same applier socket.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = system.applier.socket.with_file_name("controller-2.log");
    let second = KilledOnDrop(
        Command::new(binary("capt-controller"))
            .args([
                "--namespace",
                &ns.name,
                "--leader-election-namespace",
                &ns.name,
                "--insecure-diagnostics",
                "--metrics-bind-address",
                &addr,
                "--health-probe-bind-address",
                "127.0.0.1:0",
                "--poll-interval-seconds",
                "1",
            ])
            .args(LEASE)
            .arg("--applier-socket")
            .arg(&system.applier.socket)
            .env("KUBECONFIG", &env().kubeconfig)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?,
    );
    let second_metric = |name: &'static str| {
        let addr = addr.clone();
        async move { metric_value(&metrics(&addr).await?, name, &[]) }
    };
    system
        .wait_for(
            "the second replica's /metrics",
            Duration::from_secs(20),
            || async { Ok(metrics(&addr).await.is_ok()) },
        )
        .await?;

    // While the first leads, the second reconciles nothing and publishes nothing, even
    // when something changes.
    // The change is carried all the way through by the leader before the standby is asked.
    system.set_revision("r1")?;
    system.wait_mirrored("r1", Duration::from_secs(20)).await?;
    assert_eq!(
        second_metric("capt_reconciles_total").await?,
        0.0,
        "the standby reconciled"
    );
    assert_eq!(
        second_metric("capt_intents_published_total").await?,
        0.0,
        "the standby published"
    );
    assert!(
        system
            .controller_metric("capt_intents_published_total", &[])
            .await?
            > 0.0
    );

    // The leader dies; the standby leads within the lease duration and carries on.
    let killed = Instant::now();
    system.kill_controller();
    system
        .wait_for("the standby to lead", Duration::from_secs(10), || async {
            Ok(std::fs::read_to_string(&log)?.contains("Leading"))
        })
        .await?;
    let takeover = killed.elapsed();
    println!("takeover after {:.1} s (lease 4 s)", takeover.as_secs_f64());
    assert!(
        takeover <= Duration::from_secs(5),
        "took over after {takeover:?}"
    );
    system.set_revision("r2")?;
    system.wait_mirrored("r2", Duration::from_secs(20)).await?;
    assert!(
        second_metric("capt_intents_published_total").await? > 0.0,
        "the new leader publishes"
    );
    drop(second);
    Ok(())
}

/// A process killed (and reaped) when dropped: when the test fails too, so that a failed run
/// leaves no controller behind.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
