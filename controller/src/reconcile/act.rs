//! Carries out a [`Plan`]: each step in order, the first failure ending it (the steps
//! before it stay done, and the retry decides again from what it then observes). A plan
//! that needs what its writes answered asks to be decided again ([`Next::Redecide`]): the
//! decision is then made anew from the same snapshot and those answers. It knows no rule of
//! CAPT: what to write, and in which order, is the plan's. The only reconcile module that
//! writes.

use super::plan::{FINALIZER_MANAGER, Next, Object, Plan, Progress, SPEC_MANAGER, Sealed, Step};
use super::{Error, Result};
use crate::context::Context;
use crate::write_loops::ObjectId;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use serde_json::json;

/// How many plans one reconcile may carry out: a decision that asks for more never settles,
/// which is a fault of the decision, not of the object (the longest of today's, a new
/// control plane's whose endpoint is in its connection Secret, settles in five).
pub(super) const MOST_ROUNDS: usize = 8;

/// Carries out `plan`, made by the reconcile of `subject` (`kind/namespace/name`, which a
/// failure names); returns when to reconcile again.
pub async fn carry_out(ctx: &Context, subject: &str, plan: Plan) -> Result<Action> {
    let mut plan = Some(plan);
    carry_out_rounds(ctx, subject, |_| Ok(plan.take().unwrap_or_default())).await
}

/// Carries out the plans `decide` makes, round after round: the first from nothing written,
/// each next one (when a plan asks, [`Next::Redecide`]) from what the writes so far
/// answered. Returns when to reconcile again, or the decision's failure (what it could not
/// decide, as an error of the object: its steps before stay done).
pub async fn carry_out_rounds(
    ctx: &Context,
    subject: &str,
    mut decide: impl FnMut(&Progress) -> Result<Plan>,
) -> Result<Action> {
    let mut progress = Progress::default();
    for _ in 0..MOST_ROUNDS {
        let plan = decide(&progress)?;
        carry_out_steps(ctx, subject, plan.steps, &mut progress).await?;
        match plan.next {
            Next::Redecide => continue,
            Next::AwaitChange => return Ok(Action::await_change()),
            Next::After(after) => return Ok(Action::requeue(after)),
        }
    }
    Err(Error::Unsettled {
        subject: subject.to_owned(),
        rounds: MOST_ROUNDS,
    })
}

/// Carries out `steps`, in order, keeping what each write answered in `progress`.
pub(super) async fn carry_out_steps(
    ctx: &Context,
    subject: &str,
    steps: Vec<Step>,
    progress: &mut Progress,
) -> Result<()> {
    for step in steps {
        carry_out_step(ctx, subject, step, progress).await?;
    }
    Ok(())
}

/// Carries out one step, keeping what it answered in `progress`.
async fn carry_out_step(
    ctx: &Context,
    subject: &str,
    step: Step,
    progress: &mut Progress,
) -> Result<()> {
    let failed = |action: &'static str| {
        move |source| Error::Kube {
            subject: subject.to_owned(),
            action,
            source,
        }
    };
    match step {
        Step::Publish(publication) => {
            let key = publication.key.clone();
            let published = ctx.publish(publication).await?;
            progress.was_published(key, published.generation());
        }
        Step::Read { object, doing } => {
            let found = (api(ctx, &object).get_opt(&object.name).await).map_err(failed(doing))?;
            progress.was_read(doing, object.name, found);
        }
        Step::WriteSecret {
            secret,
            doing,
            wrote,
        } => {
            write_secret(ctx, subject, secret)
                .await
                .map_err(failed(doing))?;
            ctx.wrote(wrote.written, wrote.basis, wrote.regarding).await;
        }
        Step::PhaseReached { phase, seconds } => {
            let label = crate::metrics::PhaseLabel { phase };
            (ctx.metrics.phase_transition.get_or_create(&label)).observe(seconds.max(0.0));
        }
        Step::Apply {
            object,
            manager,
            force,
            body,
            doing,
            wrote,
        } => {
            let answer =
                (apply(ctx, &object, manager, force, &body).await).map_err(failed(doing))?;
            if let Some(w) = wrote {
                tracing::info!(subject, object = object.name, doing, "Applied");
                ctx.wrote(w.written, w.basis, w.regarding).await;
            }
            progress.answered(doing, answer);
        }
        Step::Warn(w) => {
            tracing::warn!(subject, reason = w.reason, note = w.note, "Warning");
            ctx.warn_regarding(&w.regarding, w.reason, w.action, w.note)
                .await;
        }
        Step::Merge {
            object,
            manager,
            patch,
            doing,
            wrote,
        } => {
            merge(ctx, &object, manager, &patch)
                .await
                .map_err(failed(doing))?;
            tracing::info!(subject, object = object.name, doing, "Patched");
            ctx.wrote(wrote.written, wrote.basis, wrote.regarding).await;
        }
        Step::CheckSecrets { secrets, doing } => {
            let missing = check_secrets(ctx, &secrets).await.map_err(failed(doing))?;
            progress.was_checked(doing, missing.cloned());
        }
        Step::Delete { object, doing } => {
            delete(ctx, &object).await.map_err(failed(doing))?;
            tracing::info!(subject, object = object.name, doing, "Deleting");
        }
        Step::Orphan { object, doing } => orphan(ctx, &object).await.map_err(failed(doing))?,
        Step::RemoveFinalizer { object, finalizer } => {
            tracing::debug!(subject, finalizer, "Removing our finalizer");
            remove_finalizer(ctx, &object)
                .await
                .map_err(failed("removing its finalizer"))?;
        }
        Step::Deleted { object, started } => deleted(ctx, &object, started),
    }
    Ok(())
}

/// Applies `body` to the object as `manager` (server-side apply; `force` takes the fields
/// from any other manager holding them); returns the object as the API server answered.
async fn apply(
    ctx: &Context,
    object: &Object,
    manager: &'static str,
    force: bool,
    body: &serde_json::Value,
) -> kube::Result<DynamicObject> {
    let params = PatchParams {
        force,
        ..PatchParams::apply(manager)
    };
    (api(ctx, object).patch(&object.name, &params, &Patch::Apply(body))).await
}

/// Merges `patch` into the object as `manager` (a JSON merge patch: a uid in it is a
/// precondition).
async fn merge(
    ctx: &Context,
    object: &Object,
    manager: &'static str,
    patch: &serde_json::Value,
) -> kube::Result<()> {
    let params = PatchParams {
        field_manager: Some(manager.to_owned()),
        ..PatchParams::default()
    };
    (api(ctx, object).patch(&object.name, &params, &Patch::Merge(patch))).await?;
    Ok(())
}

/// What follows an object's deletion once our finalizer is off: how long it took (when the
/// plan knows when it began), and its intents forgotten by the publisher.
fn deleted(ctx: &Context, object: &Object, started: Option<jiff::Timestamp>) {
    if let Some(started) = started {
        super::deletion_took(ctx, &object.resource.kind, started);
    }
    let id = ObjectId::of(
        &object.resource.api_version,
        &object.resource.kind,
        object.namespace.as_deref(),
        &object.name,
    );
    ctx.publisher.forget(id);
}

/// Writes a Secret the reconcile computed: created when it has no uid, else applied
/// (forced) with its uid as a precondition.
async fn write_secret(ctx: &Context, subject: &str, secret: Sealed) -> kube::Result<()> {
    let Sealed(secret) = secret;
    let (namespace, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    if secret.metadata.uid.is_none() {
        let params = PostParams {
            field_manager: Some(SPEC_MANAGER.into()),
            ..PostParams::default()
        };
        api.create(&params, &secret).await?;
    } else {
        let params = PatchParams::apply(SPEC_MANAGER).force();
        api.patch(&name, &params, &Patch::Apply(&secret)).await?;
    }
    tracing::info!(subject, secret = name, "Secret written");
    Ok(())
}

/// The first of `secrets` that does not exist, asked of the API server (metadata only) a
/// few at a time, one read shared with every check asking at once
/// ([`crate::seen_secrets`]).
async fn check_secrets<'s>(
    ctx: &Context,
    secrets: &'s [(String, String)],
) -> kube::Result<Option<&'s (String, String)>> {
    let exists = |(namespace, name): &(String, String)| {
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
        let name = name.clone();
        // Only existence is asked: a Secret's data is never read here.
        async move {
            api.get_metadata_opt(&name)
                .await
                .map(|found| found.is_some())
        }
    };
    (ctx.seen_secrets.first_missing(secrets, exists).await).map_err(|shared| {
        // The read's failure, as its own when this check was the last to hold it.
        std::sync::Arc::try_unwrap(shared)
            .unwrap_or_else(|shared| kube::Error::Service(Box::new(shared)))
    })
}

/// Deletes the object, only if it still has the uid observed: never one created again
/// under its name since.
async fn delete(ctx: &Context, object: &Object) -> kube::Result<()> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: object.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    api(ctx, object).delete(&object.name, &params).await?;
    Ok(())
}

/// Drops the object's ownerReferences. A uid in a patch is a precondition: the API server
/// refuses it (409) for another object.
async fn orphan(ctx: &Context, object: &Object) -> kube::Result<()> {
    let patch = json!({"metadata": {"uid": object.uid, "ownerReferences": null}});
    api(ctx, object)
        .patch(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Takes our finalizer off the object. Finalizers are a set: applying none under the manager
/// that added ours takes off only ours. An object already gone had ours as its last.
async fn remove_finalizer(ctx: &Context, object: &Object) -> kube::Result<()> {
    let mut body = json!({
        "apiVersion": object.resource.api_version,
        "kind": object.resource.kind,
        "metadata": {"name": object.name, "uid": object.uid, "finalizers": []},
    });
    if let Some(namespace) = &object.namespace {
        body["metadata"]["namespace"] = json!(namespace);
    }
    let params = PatchParams::apply(FINALIZER_MANAGER);
    match (api(ctx, object).patch(&object.name, &params, &Patch::Apply(body))).await {
        Err(e) if gone(&e) => Ok(()),
        written => written.map(drop),
    }
}

fn api(ctx: &Context, object: &Object) -> Api<DynamicObject> {
    let client = ctx.client.clone();
    match &object.namespace {
        Some(namespace) => Api::namespaced_with(client, namespace, &object.resource),
        None => Api::all_with(client, &object.resource),
    }
}

/// True when a write failed because its object is gone: not found, or found with another uid
/// (deleted and created again under its name).
fn gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404 || s.message.contains("uid mismatch"))
}
