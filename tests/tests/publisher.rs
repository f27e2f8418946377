//! The controller's publisher against a real status-applier and API server: what it learns
//! from an outcome (the generation its own spec write made) and what it does not send (a
//! status computed on a version of the object older than its own last write left).

use anyhow::Result;
use capt_controller::api::CAPTControlPlane;
use capt_controller::publish::{Publication, Published, Publisher};
use capt_tests::applier::Applier;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, PostParams};
use serde_json::json;
use status_applier::client::Client;
use status_applier::outcome::Action;

const MANAGER: &str = "capt-captcontrolplane";

async fn control_plane(prefix: &str) -> Result<(TestNamespace, Api<CAPTControlPlane>)> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(client, &ns.name);
    let cp = serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo"},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    }))?;
    api.create(&PostParams::default(), &cp).await?;
    Ok((ns, api))
}

fn phase(cp: &CAPTControlPlane) -> serde_json::Value {
    serde_json::to_value(cp).expect("JSON")["status"]["phase"].clone()
}

#[tokio::test]
async fn a_status_computed_on_a_version_older_than_our_last_write_is_not_sent() -> Result<()> {
    let (_ns, api) = control_plane("pub-behind").await?;
    let applier = Applier::start(&[]).await?;
    let publisher = Publisher::new(Client::new(&applier.socket));
    let seen = api.get("demo").await?;

    let first = Publication::status(&seen, MANAGER, json!({"status": {"phase": "Creating"}}));
    let published = publisher.publish(first).await?;
    assert!(
        matches!(
            published,
            Published::Sent {
                action: Action::applied,
                ..
            }
        ),
        "{published:?}"
    );

    // A reconcile that runs before the watch shows that write computes on `seen` again.
    let stale = Publication::status(&seen, MANAGER, json!({"status": {"phase": "Ready"}}));
    let published = publisher.publish(stale).await?;
    assert!(
        matches!(published, Published::Behind { .. }),
        "{published:?}"
    );
    let now = api.get("demo").await?;
    assert_eq!(phase(&now), "Creating", "nothing was written");

    // Computed on what the write left, it is sent.
    let fresh = Publication::status(&now, MANAGER, json!({"status": {"phase": "Ready"}}));
    let published = publisher.publish(fresh).await?;
    assert!(published.was_sent(), "{published:?}");
    assert_eq!(phase(&api.get("demo").await?), "Ready");
    Ok(())
}

#[tokio::test]
async fn the_generation_our_own_spec_write_made_is_known_from_its_outcome() -> Result<()> {
    let (_ns, api) = control_plane("pub-generation").await?;
    let applier = Applier::start(&[]).await?;
    let publisher = Publisher::new(Client::new(&applier.socket));
    let seen = api.get("demo").await?;
    assert_eq!(seen.metadata.generation, Some(1));

    let endpoint =
        json!({"spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}}});
    let main = Publication::main(&seen, MANAGER, endpoint.clone(), vec![]);
    let published = publisher.publish(main).await?;
    assert!(published.was_sent(), "{published:?}");
    assert_eq!(published.generation(), Some(2));

    // The same endpoint again, from the same cached object: not sent, and still known.
    let again = Publication::main(&seen, MANAGER, endpoint, vec![]);
    let published = publisher.publish(again).await?;
    assert_eq!(
        published,
        Published::Repeat {
            generation: Some(2)
        }
    );
    assert_eq!(api.get("demo").await?.metadata.generation, Some(2));
    Ok(())
}
