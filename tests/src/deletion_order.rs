//! The order in which objects are deleted, as the API server ordered it.
//!
//! Every change of an object carries a resourceVersion, an etcd revision: one sequence for
//! all objects. One watch per object records the revision at which it got its deletion
//! timestamp and the one at which it was gone, so "the control plane was gone before the VPC
//! apply started deleting" is a comparison of two revisions. Polling cannot say it: a round
//! of reads takes time, and two objects read in one round may have changed in either order.

use anyhow::{Result, bail};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What was seen of one object: the revision of its first version with a deletion
/// timestamp, and the revision at which it was deleted (equal for an object that had no
/// finalizer to wait for).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// First revision with a deletion timestamp.
    pub deleting: Option<u64>,
    /// Revision of its deletion.
    pub gone: Option<u64>,
}

/// A check of every version of one object: `Some(why)` when it is wrong.
pub type Check = Box<dyn Fn(&DynamicObject) -> Option<String> + Send + Sync>;

/// Watches of the objects whose deletion order a test checks.
pub struct DeletionOrder {
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    violations: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for DeletionOrder {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn revision(obj: &DynamicObject) -> Option<u64> {
    obj.metadata.resource_version.as_deref()?.parse().ok()
}

/// The labels of [`DeletionOrder::of_sample_stack`], in the order they must go.
pub const SAMPLE_STACK: [&str; 7] = [
    "cluster",
    "captcontrolplane",
    "captcluster",
    "cp-apply",
    "cp-workspace",
    "vpc-apply",
    "vpc-workspace",
];

impl DeletionOrder {
    /// Watches the sample stack `demo` of namespace `ns` ([`SAMPLE_STACK`]): the Cluster, both
    /// CAPT objects, their applies and their Workspaces.
    pub async fn of_sample_stack(client: &kube::Client, ns: &str) -> Result<Self> {
        use capt_controller::api::{
            CAPTCluster, CAPTControlPlane, Cluster, TerraformWorkspace, WorkspaceTemplateApply,
        };
        use capt_controller::render::workspace_name;
        use kube::api::ApiResource;
        let namespaced =
            |r: ApiResource| Api::<DynamicObject>::namespaced_with(client.clone(), ns, &r);
        let workspaces = Api::<DynamicObject>::all_with(
            client.clone(),
            &ApiResource::erase::<TerraformWorkspace>(&()),
        );
        let apply = || namespaced(ApiResource::erase::<WorkspaceTemplateApply>(&()));
        Self::watch(vec![
            (
                "cluster",
                namespaced(ApiResource::erase::<Cluster>(&())),
                "demo".into(),
            ),
            (
                "captcontrolplane",
                namespaced(ApiResource::erase::<CAPTControlPlane>(&())),
                "demo".into(),
            ),
            (
                "captcluster",
                namespaced(ApiResource::erase::<CAPTCluster>(&())),
                "demo".into(),
            ),
            ("cp-apply", apply(), "demo-controlplane".into()),
            (
                "cp-workspace",
                workspaces.clone(),
                workspace_name(ns, "demo-controlplane"),
            ),
            ("vpc-apply", apply(), "demo-vpc".into()),
            ("vpc-workspace", workspaces, workspace_name(ns, "demo-vpc")),
        ])
        .await
    }

    /// Starts one watch per `(label, api, name)` and waits until each has listed.
    pub async fn watch(objects: Vec<(&str, Api<DynamicObject>, String)>) -> Result<Self> {
        Self::watch_checking(objects, vec![]).await
    }

    /// As [`DeletionOrder::watch`], and checks every version of the objects named in
    /// `checks` (by label): a check that answers `Some(why)` is a violation
    /// ([`DeletionOrder::violations`]).
    pub async fn watch_checking(
        objects: Vec<(&str, Api<DynamicObject>, String)>,
        checks: Vec<(&str, Check)>,
    ) -> Result<Self> {
        let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
        let violations: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut checks: BTreeMap<String, Check> =
            checks.into_iter().map(|(l, c)| (l.to_owned(), c)).collect();
        let mut tasks = Vec::new();
        let mut listed = Vec::new();
        for (label, api, name) in objects {
            let (ready, listed_rx) = tokio::sync::oneshot::channel::<()>();
            listed.push(listed_rx);
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut events = watcher(api, config).boxed();
            let (seen, violations, label) = (seen.clone(), violations.clone(), label.to_owned());
            let check = checks.remove(&label);
            seen.lock()
                .expect("lock")
                .insert(label.clone(), Seen::default());
            tasks.push(tokio::spawn(async move {
                let mut ready = Some(ready);
                while let Some(event) = events.next().await {
                    let record = |f: &dyn Fn(&mut Seen)| {
                        f(seen
                            .lock()
                            .expect("lock")
                            .get_mut(&label)
                            .expect("inserted"))
                    };
                    match event {
                        Ok(watcher::Event::InitDone) => {
                            if let Some(r) = ready.take() {
                                let _ = r.send(());
                            }
                        }
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                            if let Some(why) = check.as_ref().and_then(|c| c(&o)) {
                                violations
                                    .lock()
                                    .expect("lock")
                                    .push(format!("{label}: {why}"));
                            }
                            if o.metadata.deletion_timestamp.is_some() {
                                let rv = revision(&o);
                                record(&|s| s.deleting = s.deleting.or(rv));
                            }
                        }
                        Ok(watcher::Event::Delete(o)) => {
                            let rv = revision(&o);
                            record(&|s| {
                                s.deleting = s.deleting.or(rv);
                                s.gone = s.gone.or(rv);
                            });
                        }
                        Ok(watcher::Event::Init) | Err(_) => {}
                    }
                }
            }));
        }
        for rx in listed {
            tokio::time::timeout(Duration::from_secs(20), rx).await??;
        }
        Ok(Self {
            seen,
            violations,
            tasks,
        })
    }

    /// What was seen of each object so far.
    pub fn seen(&self) -> BTreeMap<String, Seen> {
        self.seen.lock().expect("lock").clone()
    }

    /// The checks' violations so far.
    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().expect("lock").clone()
    }

    /// Waits until every object of `labels` is gone.
    pub async fn wait_gone(&self, labels: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.seen();
            if labels
                .iter()
                .all(|l| seen.get(*l).is_some_and(|s| s.gone.is_some()))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("not gone within {timeout:?}: {seen:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The revision at which `label` was gone.
    pub fn gone(&self, label: &str) -> u64 {
        let seen = self.seen();
        seen.get(label)
            .and_then(|s| s.gone)
            .unwrap_or_else(|| panic!("{label} never disappeared: {seen:?}"))
    }

    /// The revision at which `label` started deleting.
    pub fn deleting(&self, label: &str) -> u64 {
        let seen = self.seen();
        seen.get(label)
            .and_then(|s| s.deleting)
            .unwrap_or_else(|| panic!("{label} was never deleted: {seen:?}"))
    }
}
