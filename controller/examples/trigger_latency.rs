//! How long a reference sent to a controller (`Controller::reconcile_on`, as the watches wake
//! ours) waits before its reconcile starts, beside the floor: the same reference handed from
//! one task to another over a channel, in the same run.
//!
//! kube-rs's scheduler puts every request in a `tokio_util` `DelayQueue`, which rounds its
//! deadline up to the next millisecond and waits for a timer even when the request is due at
//! once (`debounce` is zero here, as ours is). That wait is part of our hop from a Workspace
//! change to the control plane's status (`docs/performance-history.md`, "Where our reaction goes").
//!
//! `cargo run --release -p capt-controller --example trigger_latency [-- <samples>]`

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The pause between two samples: the queue is idle when each reference arrives, as it is
/// when a lone Workspace change wakes a controller.
const PAUSE: Duration = Duration::from_millis(3);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let samples: usize = match std::env::args().nth(1) {
        Some(n) => n
            .parse()
            .map_err(|e| anyhow::anyhow!("samples: {n:?} is not a count: {e}"))?,
        None => 500,
    };
    anyhow::ensure!(samples > 0, "samples: at least one");
    let controller = controller_wait(samples).await;
    let channel = channel_wait(samples).await;
    println!("{samples} samples, each after {PAUSE:?} idle");
    report(
        "reconcile_on -> reconcile starts (kube-rs scheduler)",
        controller,
    );
    report("channel -> receiving task (the floor)", channel);
    Ok(())
}

/// Sends one cached object's reference to a controller per sample and times its reconcile's
/// start.
async fn controller_wait(samples: usize) -> Vec<Duration> {
    let (reader, mut writer) = reflector::store::<ConfigMap>();
    let mut object = ConfigMap::default();
    object.metadata.name = Some("a".into());
    object.metadata.namespace = Some("ns".into());
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(object));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let (wake, woken) = futures::channel::mpsc::unbounded::<ObjectRef<ConfigMap>>();
    let (started, mut starts) = mpsc::unbounded_channel::<Instant>();
    let controller = Controller::for_stream(futures::stream::empty(), reader)
        .reconcile_on(woken)
        .run(
            |_, started: Arc<mpsc::UnboundedSender<Instant>>| async move {
                let _ = started.send(Instant::now());
                Ok::<_, std::convert::Infallible>(Action::await_change())
            },
            |_, _, _| Action::await_change(),
            Arc::new(started),
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);
    let mut waits = Vec::with_capacity(samples);
    for _ in 0..samples {
        tokio::time::sleep(PAUSE).await;
        let sent = Instant::now();
        wake.unbounded_send(ObjectRef::new("a").within("ns"))
            .expect("the controller runs");
        let start = starts.recv().await.expect("the controller runs");
        waits.push(start - sent);
    }
    controller.abort();
    waits
}

/// Hands an instant to another task per sample and times its arrival there.
async fn channel_wait(samples: usize) -> Vec<Duration> {
    let (send, mut receive) = mpsc::unbounded_channel::<Instant>();
    let (arrived, mut arrivals) = mpsc::unbounded_channel::<Duration>();
    let receiver = tokio::spawn(async move {
        while let Some(sent) = receive.recv().await {
            let _ = arrived.send(sent.elapsed());
        }
    });
    let mut waits = Vec::with_capacity(samples);
    for _ in 0..samples {
        tokio::time::sleep(PAUSE).await;
        send.send(Instant::now()).expect("the receiver runs");
        waits.push(arrivals.recv().await.expect("the receiver runs"));
    }
    receiver.abort();
    waits
}

fn report(what: &str, mut waits: Vec<Duration>) {
    waits.sort();
    let at = |p: f64| {
        let i = ((waits.len() - 1) as f64 * p).round() as usize;
        waits[i].as_secs_f64() * 1000.0
    };
    println!(
        "{what}: p50 {:.3} ms, p90 {:.3}, p99 {:.3}, max {:.3}",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
}
