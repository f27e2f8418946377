//! Benchmark: intent → applied through the status-applier sidecar, against a direct kube-rs
//! server-side-apply loop, in the same run on the same API server. Prints a table.
//!
//! `hack/bench-applier.sh [APPLIES] [OBJECTS]` builds in release mode and runs it.

use anyhow::Result;
use capt_controller::api::CAPTControlPlane;
use capt_tests::applier::Applier;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use status_applier::intent::Intent;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let applies: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);
    let objects: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(50);
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "bench").await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(client, &ns.name);
    for i in 0..objects * 4 {
        let obj: CAPTControlPlane = serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "metadata": {"name": format!("cp-{i}")},
            "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
        }))?;
        api.create(&PostParams::default(), &obj).await?;
    }
    eprintln!(
        "bench: {applies} applies over {objects} CAPTControlPlanes, sequential, each changing status.observedGeneration"
    );

    let mut rows = vec![direct(&api, applies, objects).await?];
    // Each path writes its own objects, so no manager meets another's fields.
    let settings: [(&str, &[&str]); 3] = [
        ("window 0 ms", &["--coalesce-window-ms", "0"]),
        (
            "window 10 ms, trailing edge",
            &[
                "--coalesce-window-ms",
                "10",
                "--apply-lone-intents-at-once=false",
            ],
        ),
        (
            "window 10 ms, leading edge (the default)",
            &["--coalesce-window-ms", "10"],
        ),
    ];
    for (set, (label, args)) in settings.iter().enumerate() {
        let applier = Applier::start(&[*args, &["--no-events"]].concat()).await?;
        rows.push(
            sidecar(
                &applier,
                &ns.name,
                applies,
                ((set + 1) * objects, objects),
                label,
            )
            .await?,
        );
        let writes = applier
            .metric("status_applier_api_writes_total", &[])
            .await?;
        eprintln!("bench: sidecar ({label}) sent {writes} writes for {applies} intents");
    }

    println!("| path | applies | applies/s | p50 ms | p99 ms | max ms |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for row in &rows {
        println!("{row}");
    }
    let overhead = rows[1].p(0.50) - rows[0].p(0.50);
    println!(
        "\nsidecar hop overhead at p50 (window 0 ms minus direct): {:.3} ms",
        overhead.as_secs_f64() * 1000.0
    );
    Ok(())
}

struct Row {
    name: String,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Row {
    fn new(name: String, mut latencies: Vec<Duration>, elapsed: Duration) -> Self {
        latencies.sort();
        Self {
            name,
            latencies,
            elapsed,
        }
    }

    fn p(&self, q: f64) -> Duration {
        let i = ((self.latencies.len() as f64 - 1.0) * q).round() as usize;
        self.latencies[i]
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} |",
            self.name,
            self.latencies.len(),
            self.latencies.len() as f64 / self.elapsed.as_secs_f64(),
            ms(self.p(0.50)),
            ms(self.p(0.99)),
            ms(*self.latencies.last().unwrap_or(&Duration::ZERO)),
        )
    }
}

async fn direct(api: &Api<CAPTControlPlane>, applies: usize, objects: usize) -> Result<Row> {
    let params = PatchParams::apply("bench-direct");
    let mut latencies = Vec::with_capacity(applies);
    let started = Instant::now();
    for i in 0..applies {
        let body = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
                          "status": {"observedGeneration": i}});
        let t = Instant::now();
        api.patch_status(&format!("cp-{}", i % objects), &params, &Patch::Apply(body))
            .await?;
        latencies.push(t.elapsed());
    }
    Ok(Row::new(
        "direct kube-rs apply".into(),
        latencies,
        started.elapsed(),
    ))
}

async fn sidecar(
    applier: &Applier,
    ns: &str,
    applies: usize,
    (first, objects): (usize, usize),
    label: &str,
) -> Result<Row> {
    let mut latencies = Vec::with_capacity(applies);
    let started = Instant::now();
    for i in 0..applies {
        let intent: Intent = serde_json::from_value(json!({
            "target": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
                       "namespace": ns, "name": format!("cp-{}", first + i % objects)},
            "subresource": "status", "fieldManager": "bench-sidecar",
            "fragment": {"status": {"observedGeneration": i}},
        }))?;
        let t = Instant::now();
        let answer = applier.client.submit(&intent, true).await?;
        latencies.push(t.elapsed());
        anyhow::ensure!(
            answer.json()["action"] == "applied",
            "intent {i}: {}",
            answer.body
        );
    }
    Ok(Row::new(
        format!("sidecar, intent → applied ({label})"),
        latencies,
        started.elapsed(),
    ))
}
