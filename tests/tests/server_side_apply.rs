//! The server-side-apply behaviour the whole project rests on, shown against the real
//! kube-apiserver with our CRDs: shared ownership of status, 409 conflicts, the rule that an
//! omitted field is deleted, and list-map conditions.

use anyhow::Result;
use capt_controller::api::CAPTControlPlane;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

async fn control_plane(prefix: &str) -> Result<(TestNamespace, Api<CAPTControlPlane>)> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(client, &ns.name);
    let obj: CAPTControlPlane = serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo"},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    Ok((ns, api))
}

fn status_apply(status: Value) -> Patch<Value> {
    Patch::Apply(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "status": status,
    }))
}

async fn apply_status(
    api: &Api<CAPTControlPlane>,
    manager: &str,
    status: Value,
) -> kube::Result<CAPTControlPlane> {
    api.patch_status("demo", &PatchParams::apply(manager), &status_apply(status))
        .await
}

/// The fieldsV1 of a manager's status apply entry.
fn fields_of(obj: &CAPTControlPlane, manager: &str) -> Option<Value> {
    let entries = obj.metadata.managed_fields.as_ref()?;
    let entry = entries.iter().find(|e| {
        e.manager.as_deref() == Some(manager) && e.subresource.as_deref() == Some("status")
    })?;
    assert_eq!(entry.operation.as_deref(), Some("Apply"));
    Some(entry.fields_v1.as_ref()?.0.clone())
}

#[tokio::test]
async fn two_managers_share_status_each_owning_only_its_fields() -> Result<()> {
    let (_ns, api) = control_plane("ssa-share").await?;
    apply_status(
        &api,
        "manager-a",
        json!({"phase": "Creating", "ready": false}),
    )
    .await?;
    let obj = apply_status(&api, "manager-b", json!({"version": "1.31"})).await?;

    let a = fields_of(&obj, "manager-a").expect("manager-a owns fields");
    let b = fields_of(&obj, "manager-b").expect("manager-b owns fields");
    assert_eq!(a["f:status"], json!({"f:phase": {}, "f:ready": {}}));
    assert_eq!(b["f:status"], json!({"f:version": {}}));
    let status = obj.status.expect("status is set");
    assert_eq!(status.version.as_deref(), Some("1.31"));
    assert_eq!(status.ready, Some(false));
    Ok(())
}

#[tokio::test]
async fn changing_a_field_another_manager_owns_is_a_409_naming_field_and_owner() -> Result<()> {
    let (_ns, api) = control_plane("ssa-conflict").await?;
    apply_status(&api, "manager-a", json!({"phase": "Creating"})).await?;
    apply_status(&api, "manager-b", json!({"version": "1.31"})).await?;

    let err = apply_status(&api, "manager-c", json!({"phase": "Ready"}))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!(status.code, 409, "{status:?}");
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.clone())
        .unwrap_or_default();
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0].field, ".status.phase");
    assert!(
        causes[0].message.contains("\"manager-a\""),
        "{}",
        causes[0].message
    );

    // The same value is no conflict: agreement is shared ownership.
    let obj = apply_status(&api, "manager-c", json!({"phase": "Creating"})).await?;
    assert_eq!(
        fields_of(&obj, "manager-c").unwrap()["f:status"],
        json!({"f:phase": {}})
    );
    assert_eq!(
        fields_of(&obj, "manager-a").unwrap()["f:status"],
        json!({"f:phase": {}})
    );
    Ok(())
}

#[tokio::test]
async fn an_apply_that_omits_at_provider_deletes_it() -> Result<()> {
    // The SSA rule the status-applier guards against: what a manager applied before and
    // omits now is removed. This is how a partial status apply loses Terraform outputs.
    let (_ns, api) = control_plane("ssa-omit").await?;
    let at_provider = json!({"checksum": "fff6cc", "outputs": {"cluster_endpoint": "https://x.eks.amazonaws.com"}});
    let obj = apply_status(
        &api,
        "capt-captcontrolplane",
        json!({"phase": "Ready", "workspaceStatus": {"ready": true, "atProvider": at_provider}}),
    )
    .await?;
    let ws = obj.status.unwrap().workspace_status.unwrap();
    assert_eq!(ws.at_provider, Some(at_provider));

    let obj = apply_status(
        &api,
        "capt-captcontrolplane",
        json!({"phase": "Ready", "workspaceStatus": {"ready": true}}),
    )
    .await?;
    let ws = obj.status.unwrap().workspace_status.unwrap();
    assert_eq!(ws.at_provider, None, "the omitted atProvider was deleted");
    assert_eq!(ws.ready, Some(true));
    Ok(())
}

#[tokio::test]
async fn conditions_of_different_types_from_two_managers_coexist() -> Result<()> {
    let (_ns, api) = control_plane("ssa-conditions").await?;
    let condition = |t: &str| json!({"type": t, "status": "True", "reason": "Test", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    apply_status(
        &api,
        "manager-a",
        json!({"conditions": [condition("Ready")]}),
    )
    .await?;
    let obj = apply_status(
        &api,
        "manager-b",
        json!({"conditions": [condition("Initialized")]}),
    )
    .await?;

    let a = fields_of(&obj, "manager-a").unwrap();
    let types: Vec<String> = obj
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Ready", "Initialized"]);
    assert!(
        a["f:status"]["f:conditions"]
            .get("k:{\"type\":\"Ready\"}")
            .is_some(),
        "{a}"
    );
    assert!(
        a["f:status"]["f:conditions"]
            .get("k:{\"type\":\"Initialized\"}")
            .is_none(),
        "{a}"
    );

    // manager-a drops its condition: only its own element goes.
    let obj = apply_status(&api, "manager-a", json!({"conditions": []})).await?;
    let types: Vec<String> = obj
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, ["Initialized"]);
    Ok(())
}
