//! Event-sequence tests of the state machine: plain synchronous steps, each followed by
//! assertions on the effects it produced. The clock is a number of milliseconds from a
//! fixed start; objects are built by hand, with their `managedFields`, as the API server
//! would show them. The kind is a made-up `Widget`: the engine knows no kind.

use super::Tuning;
use super::events::{Count, Effect, Event, Ticket};
use super::machine::Machine;
use crate::config::Policy;
use crate::error::ApplyError;
use crate::intent::{DesiredKey, ObjectRef, Subresource, ValidIntent};
use crate::metrics::Action;
use crate::outcome::Outcome;
use crate::view::View;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OURS: &str = "widget-status";
const UID: &str = "uid-1";

fn object() -> ObjectRef {
    ObjectRef {
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        namespace: Some("team-a".into()),
        name: "w1".into(),
    }
}

fn status_key() -> DesiredKey {
    DesiredKey {
        object: object(),
        subresource: Some(Subresource::Status),
        field_manager: OURS.into(),
    }
}

fn main_key() -> DesiredKey {
    DesiredKey {
        object: object(),
        subresource: None,
        field_manager: "widget-spec".into(),
    }
}

/// One `managedFields` entry: (manager, operation, subresource, fieldsV1).
type Managed = (&'static str, &'static str, &'static str, Value);

/// The object at `resource_version` with `fields` (spec, status, ...) and `managed`.
fn mk_widget(resource_version: u64, uid: &str, fields: Value, managed: &[Managed]) -> Arc<View> {
    let managed: Vec<Value> = managed
        .iter()
        .map(|(manager, operation, subresource, fields)| {
            let mut e = json!({"manager": manager, "operation": operation,
                "fieldsType": "FieldsV1", "fieldsV1": fields});
            if !subresource.is_empty() {
                e["subresource"] = json!(subresource);
            }
            e
        })
        .collect();
    let mut object = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "team-a", "uid": uid,
                     "resourceVersion": resource_version.to_string(), "managedFields": managed},
    });
    if let (Value::Object(o), Value::Object(f)) = (&mut object, fields) {
        o.extend(f);
    }
    Arc::new(View::whole(
        serde_json::from_value(object).expect("a widget"),
    ))
}

fn intent(key: &DesiredKey, fragment: Value) -> ValidIntent {
    ValidIntent {
        key: key.clone(),
        uid: None,
        fragment,
        release: Vec::new(),
        not_older_than: None,
    }
}

/// An intent whose submitter knew the object at `resource_version` (`notOlderThan`).
fn intent_after(key: &DesiredKey, fragment: Value, resource_version: u64) -> ValidIntent {
    ValidIntent {
        not_older_than: Some(resource_version),
        ..intent(key, fragment)
    }
}

fn view_waits(effects: &[Effect]) -> Vec<crate::metrics::WaitEnd> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Counted(Count::ViewWait(_, end)) => Some(*end),
            _ => None,
        })
        .collect()
}

/// A machine, a clock, and what the driver's watch cache would hold.
/// The tuning the scenarios run on: the defaults, on the trailing edge.
fn trailing() -> Tuning {
    Tuning {
        apply_lone_intents_at_once: false,
        ..Tuning::default()
    }
}

struct Harness {
    machine: Machine,
    start: Instant,
    now: Instant,
    next_ticket: Ticket,
    /// The newest object the watch delivered: the driver passes it with each intent.
    cached: Option<Arc<View>>,
}

impl Harness {
    fn new(tuning: Tuning) -> Self {
        let start = Instant::now();
        Self {
            machine: Machine::new(Arc::new(Policy::default()), tuning, 7),
            start,
            now: start,
            next_ticket: 1,
            cached: None,
        }
    }

    /// On the trailing edge: the scenarios step through a coalescing window, so their
    /// first apply comes a window after the intent. The default (leading edge) has tests of
    /// its own, which say so.
    fn default() -> Self {
        Self::new(trailing())
    }

    /// Moves the clock to `ms` after the start.
    fn at(&mut self, ms: u64) -> &mut Self {
        self.now = self.start + Duration::from_millis(ms);
        self
    }

    fn ms(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    fn feed(&mut self, event: Event) -> Vec<Effect> {
        self.machine.handle(event, self.now)
    }

    /// Submits `intent` with the watch cache's view, as the driver does; answers its ticket
    /// and the effects.
    fn submit(&mut self, intent: ValidIntent, wait: bool) -> (Ticket, Vec<Effect>) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let effects = self.feed(Event::Intent {
            intent,
            ticket,
            wait,
            view: Ok(self.cached.clone()),
        });
        (ticket, effects)
    }

    /// The opening most tests share: the fresh widget seen, `status.a: "1"` submitted, its
    /// window passed at 10 ms and its apply answered at 12 ms with the widget at `rv`. Answers
    /// the effects of the answer.
    fn apply_a1(&mut self, resource_version: u64) -> Vec<Effect> {
        self.observe(fresh_widget());
        self.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
        self.at(10).timer(&status_key());
        let answer = widget_with_ours(
            resource_version,
            json!({"a": "1"}),
            json!({"f:status": {"f:a": {}}}),
        );
        self.at(12).applied(&status_key(), Ok(answer))
    }

    /// The watch delivers `view`.
    fn observe(&mut self, view: Arc<View>) -> Vec<Effect> {
        self.cached = Some(view.clone());
        self.feed(Event::Observed {
            object: object(),
            view,
        })
    }

    fn timer(&mut self, key: &DesiredKey) -> Vec<Effect> {
        self.feed(Event::Timer(key.clone()))
    }

    fn applied(&mut self, key: &DesiredKey, result: Result<Arc<View>, ApplyError>) -> Vec<Effect> {
        self.feed(Event::Applied {
            key: key.clone(),
            result,
        })
    }
}

fn applies(effects: &[Effect]) -> Vec<&Value> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Apply(request) => Some(&request.body),
            _ => None,
        })
        .collect()
}

/// The one apply among `effects`.
fn the_apply(effects: &[Effect]) -> &Value {
    let found = applies(effects);
    assert_eq!(found.len(), 1, "one apply expected: {effects:#?}");
    found[0]
}

fn answers(effects: &[Effect]) -> Vec<(Ticket, &Outcome)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Answer { ticket, outcome } => Some((*ticket, outcome)),
            _ => None,
        })
        .collect()
}

fn answer(effects: &[Effect], ticket: Ticket) -> Option<&Outcome> {
    answers(effects)
        .into_iter()
        .find(|(t, _)| *t == ticket)
        .map(|(_, o)| o)
}

/// Asserts that `ticket` was answered at once with `error`, naming the failed read.
fn answered_read_failure(effects: &[Effect], ticket: Ticket) {
    let outcome = answer(effects, ticket).expect("answered at once");
    assert_eq!(outcome.action, Action::error);
    assert!(
        outcome
            .message
            .as_deref()
            .is_some_and(|m| m.contains("reading the object: ")),
        "{outcome:?}"
    );
}

fn wakes(effects: &[Effect]) -> Vec<Instant> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::WakeAt { at, .. } => Some(*at),
            _ => None,
        })
        .collect()
}

fn reads(effects: &[Effect]) -> usize {
    effects
        .iter()
        .filter(|e| matches!(e, Effect::Read(_)))
        .count()
}

fn attempts(effects: &[Effect]) -> Vec<Action> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Counted(Count::Attempt(_, action)) => Some(*action),
            _ => None,
        })
        .collect()
}

/// The widget as it is before any intent: rv 5, created by a user.
fn fresh_widget() -> Arc<View> {
    mk_widget(
        5,
        UID,
        json!({"spec": {"size": 1}}),
        &[("kubectl", "Update", "", json!({"f:spec": {"f:size": {}}}))],
    )
}

/// The widget at `resource_version` with `phase: Creating`, owned by core's update.
fn core_owns_the_phase(resource_version: u64) -> Arc<View> {
    mk_widget(
        resource_version,
        UID,
        json!({"status": {"phase": "Creating"}}),
        &[(
            "core",
            "Update",
            "status",
            json!({"f:status": {"f:phase": {}}}),
        )],
    )
}

/// The widget at `resource_version` after its user resized it.
fn resized_widget(resource_version: u64) -> Arc<View> {
    mk_widget(
        resource_version,
        UID,
        json!({"spec": {"size": 2}}),
        &[("kubectl", "Update", "", json!({"f:spec": {"f:size": {}}}))],
    )
}

/// The widget after our manager applied `status`.
fn widget_with_ours(resource_version: u64, status: Value, fields: Value) -> Arc<View> {
    mk_widget(
        resource_version,
        UID,
        json!({"spec": {"size": 1}, "status": status}),
        &[(OURS, "Apply", "status", fields)],
    )
}

#[test]
fn a_lone_intent_waits_one_window_then_applies_with_the_views_version_and_uid() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let (ticket, effects) = h.submit(
        intent(&status_key(), json!({"status": {"phase": "Ready"}})),
        false,
    );
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::queued)
    );
    assert_eq!(wakes(&effects), vec![h.ms(10)]);
    assert!(applies(&effects).is_empty());

    let effects = h.at(10).timer(&status_key());
    let body = the_apply(&effects);
    assert_eq!(body["metadata"]["resourceVersion"], "5");
    assert_eq!(body["metadata"]["uid"], UID);
    assert_eq!(body["status"], json!({"phase": "Ready"}));
}

#[test]
fn intents_within_the_window_coalesce_into_one_apply() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    let (t2, effects) = h
        .at(5)
        .submit(intent(&status_key(), json!({"status": {"b": "2"}})), false);
    assert_eq!(
        answer(&effects, t2).map(|o| o.action),
        Some(Action::coalesced)
    );
    assert_eq!(wakes(&effects), vec![h.ms(15)], "the window restarts");
    assert!(
        h.at(10).timer(&status_key()).is_empty(),
        "the first timer is early now"
    );
    let effects = h.at(15).timer(&status_key());
    assert_eq!(the_apply(&effects)["status"], json!({"a": "1", "b": "2"}));
}

#[test]
fn a_steady_stream_of_intents_is_applied_after_ten_windows_at_the_latest() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let mut last_wake = None;
    for i in 0..20u64 {
        let effects = h
            .at(i * 5)
            .submit(intent(&status_key(), json!({"status": {"n": i}})), false)
            .1;
        last_wake = wakes(&effects).last().copied().or(last_wake);
    }
    assert_eq!(
        last_wake,
        Some(h.ms(100)),
        "capped at ten windows after the first intent"
    );
    let effects = h.at(100).timer(&status_key());
    assert_eq!(the_apply(&effects)["status"]["n"], 19);
}

#[test]
fn by_default_a_burst_of_100_intents_is_two_applies_and_the_last_state_wins() {
    let mut h = Harness::new(Tuning::default());
    h.observe(fresh_widget());
    let mut sent = Vec::new();
    for n in 0..100 {
        let (_, effects) = h.submit(intent(&status_key(), json!({"status": {"n": n}})), false);
        sent.extend(applies(&effects).into_iter().cloned());
    }
    assert_eq!(sent.len(), 1, "the first intent, at once");
    assert_eq!(sent[0]["status"]["n"], 0);
    let effects = h.at(3).applied(
        &status_key(),
        Ok(widget_with_ours(
            6,
            json!({"n": 0}),
            json!({"f:status": {"f:n": {}}}),
        )),
    );
    assert!(applies(&effects).is_empty());
    assert_eq!(
        wakes(&effects),
        vec![h.ms(13)],
        "a window after the first apply's answer"
    );
    let effects = h.at(13).timer(&status_key());
    let second = applies(&effects);
    assert_eq!(second.len(), 1, "the other 99, as one apply");
    assert_eq!(second[0]["status"]["n"], 99);
}

#[test]
fn by_default_a_lone_intent_is_applied_at_once_and_what_follows_coalesces() {
    let mut h = Harness::new(Tuning::default());
    h.observe(fresh_widget());
    let (_, effects) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    assert_eq!(the_apply(&effects)["status"], json!({"a": "1"}));
    // What follows within the window, while the apply is in flight, waits for it.
    let (t2, effects) = h
        .at(1)
        .submit(intent(&status_key(), json!({"status": {"b": "2"}})), true);
    assert!(applies(&effects).is_empty());
    let effects = h.at(3).applied(
        &status_key(),
        Ok(widget_with_ours(
            6,
            json!({"a": "1"}),
            json!({"f:status": {"f:a": {}}}),
        )),
    );
    assert_eq!(answer(&effects, t2), None, "the apply did not carry it");
    assert_eq!(wakes(&effects), vec![h.ms(13)]);
    let effects = h.at(13).timer(&status_key());
    let body = the_apply(&effects);
    assert_eq!(
        body["metadata"]["resourceVersion"], "6",
        "planned on the apply's answer"
    );
    assert_eq!(body["status"], json!({"a": "1", "b": "2"}));
}

#[test]
fn an_apply_refused_as_stale_is_planned_again_on_a_fresh_read_never_on_the_stale_view() {
    // The replay's lost field: the view still shows a foreign manager owning `out.a` with
    // another value, so the plan leaves `out.a` out. On the object as it is, the foreign
    // manager has released it and we own it alone: sent, that plan would delete our value.
    let mut h = Harness::default();
    let stale = mk_widget(
        8,
        UID,
        json!({"status": {"out": {"a": "theirs"}}}),
        &[
            (
                OURS,
                "Apply",
                "status",
                json!({"f:status": {"f:out": {"f:a": {}}}}),
            ),
            (
                "foreign-u",
                "Update",
                "status",
                json!({"f:status": {"f:out": {"f:a": {}}}}),
            ),
        ],
    );
    h.observe(stale);
    let (ticket, _) = h.submit(
        intent(
            &status_key(),
            json!({"status": {"out": {"a": "ours"}, "phase": "Ready"}}),
        ),
        true,
    );
    let effects = h.at(10).timer(&status_key());
    let body = the_apply(&effects);
    assert_eq!(
        body["metadata"]["resourceVersion"], "8",
        "the precondition is the view's"
    );
    assert_eq!(
        body["status"],
        json!({"phase": "Ready"}),
        "out.a left to its foreign owner"
    );

    let effects = h.at(12).applied(&status_key(), Err(ApplyError::Stale));
    assert_eq!(reads(&effects), 1, "read again");
    assert!(applies(&effects).is_empty() && answer(&effects, ticket).is_none());

    let current = mk_widget(
        11,
        UID,
        json!({"status": {"out": {"a": "ours"}}}),
        &[(
            OURS,
            "Apply",
            "status",
            json!({"f:status": {"f:out": {"f:a": {}}}}),
        )],
    );
    let effects = h.at(14).observe(current);
    let body = the_apply(&effects);
    assert_eq!(body["metadata"]["resourceVersion"], "11");
    assert_eq!(
        body["status"],
        json!({"out": {"a": "ours"}, "phase": "Ready"}),
        "nothing of ours left out"
    );

    let done = widget_with_ours(
        12,
        json!({"out": {"a": "ours"}, "phase": "Ready"}),
        json!({"f:status": {"f:out": {"f:a": {}}, "f:phase": {}}}),
    );
    let effects = h.at(16).applied(&status_key(), Ok(done));
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::applied)
    );
}

#[test]
fn an_intent_naming_a_newer_version_waits_for_the_watch_and_is_planned_on_that_view() {
    // The submitter's own write (a finalizer, say) left the widget at rv 8; the watch still
    // shows rv 5. Planned on rv 5, the apply would be refused as stale.
    let mut h = Harness::new(Tuning::default());
    h.observe(fresh_widget());
    let (ticket, effects) = h.submit(
        intent_after(&status_key(), json!({"status": {"phase": "Ready"}}), 8),
        true,
    );
    assert!(applies(&effects).is_empty(), "{effects:#?}");
    assert_eq!(reads(&effects), 0);
    assert_eq!(
        wakes(&effects),
        vec![h.ms(1_000)],
        "waits at most view_wait"
    );

    let effects = h.at(40).observe(resized_widget(8));
    let body = the_apply(&effects);
    assert_eq!(body["metadata"]["resourceVersion"], "8");
    assert_eq!(body["status"], json!({"phase": "Ready"}));
    assert_eq!(
        view_waits(&effects),
        vec![crate::metrics::WaitEnd::caught_up]
    );

    // The end of the wait, long past, changes nothing.
    let effects = h.at(1_000).timer(&status_key());
    assert!(applies(&effects).is_empty() && reads(&effects) == 0);
    let effects = h.at(45).applied(
        &status_key(),
        Ok(widget_with_ours(
            9,
            json!({"phase": "Ready"}),
            json!({"f:status": {"f:phase": {}}}),
        )),
    );
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::applied)
    );
}

#[test]
fn an_intent_no_newer_than_the_view_is_planned_at_once() {
    let mut h = Harness::new(Tuning::default());
    h.observe(fresh_widget());
    let (_, effects) = h.submit(
        intent_after(&status_key(), json!({"status": {"phase": "Ready"}}), 5),
        false,
    );
    assert_eq!(the_apply(&effects)["metadata"]["resourceVersion"], "5");
    assert!(view_waits(&effects).is_empty());
}

#[test]
fn a_wait_for_a_view_that_does_not_come_ends_in_one_read() {
    let mut h = Harness::new(Tuning::default());
    h.observe(fresh_widget());
    h.submit(
        intent_after(&status_key(), json!({"status": {"phase": "Ready"}}), 8),
        false,
    );
    let effects = h.at(999).timer(&status_key());
    assert!(applies(&effects).is_empty() && reads(&effects) == 0);
    let effects = h.at(1_000).timer(&status_key());
    assert_eq!(reads(&effects), 1, "{effects:#?}");
    assert!(applies(&effects).is_empty());
    assert_eq!(view_waits(&effects), vec![crate::metrics::WaitEnd::read]);
    // The read shows the object as it is; the plan is made on it.
    let effects = h.at(1_005).feed(Event::Observed {
        object: object(),
        view: resized_widget(9),
    });
    assert_eq!(the_apply(&effects)["metadata"]["resourceVersion"], "9");
}

#[test]
fn a_view_older_than_the_one_held_changes_nothing() {
    let mut h = Harness::default();
    let effects = h.apply_a1(9);
    assert_eq!(attempts(&effects), vec![Action::applied]);
    // The watch delivers the version before our apply, then our apply itself.
    assert!(h.at(13).observe(fresh_widget()).is_empty());
    assert!(
        h.at(14)
            .observe(widget_with_ours(
                9,
                json!({"a": "1"}),
                json!({"f:status": {"f:a": {}}})
            ))
            .is_empty()
    );
    let view = h.machine.view(&object()).expect("a view");
    assert_eq!(view.metadata.resource_version.as_deref(), Some("9"));
}

#[test]
fn refusals_as_stale_back_off_after_three_applies_and_two_reads_and_answer_a_conflict() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let (ticket, _) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    let mut effects = h.at(10).timer(&status_key());
    for (i, rv) in [(0, 6), (1, 7)] {
        assert_eq!(applies(&effects).len(), 1, "try {i}");
        effects = h.applied(&status_key(), Err(ApplyError::Stale));
        assert_eq!(reads(&effects), 1);
        effects = h.observe(mk_widget(rv, UID, json!({}), &[]));
    }
    assert_eq!(applies(&effects).len(), 1, "third try");
    let effects = h.at(20).applied(&status_key(), Err(ApplyError::Stale));
    assert_eq!(reads(&effects), 0, "no hot loop");
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::conflict)
    );
    let wake = wakes(&effects);
    assert_eq!(wake.len(), 1);
    let delay = wake[0] - h.ms(20);
    assert!(
        delay >= Duration::from_millis(100) && delay <= Duration::from_millis(300),
        "{delay:?}"
    );
}

#[test]
fn an_apply_that_would_change_nothing_sends_no_request() {
    let mut h = Harness::default();
    h.observe(widget_with_ours(
        6,
        json!({"a": "1"}),
        json!({"f:status": {"f:a": {}}}),
    ));
    let (ticket, _) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    let effects = h.at(10).timer(&status_key());
    assert!(applies(&effects).is_empty());
    assert_eq!(attempts(&effects), vec![Action::unchanged]);
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::unchanged)
    );
    // The same intent again is answered at once, with no timer.
    let (again, effects) = h
        .at(50)
        .submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    assert_eq!(
        answer(&effects, again).map(|o| o.action),
        Some(Action::unchanged)
    );
    assert!(wakes(&effects).is_empty());
}

#[test]
fn one_key_per_object_at_a_time_and_the_second_is_planned_on_the_firsts_answer() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    h.submit(
        intent(&main_key(), json!({"spec": {"colour": "red"}})),
        false,
    );
    h.at(10);
    let mut effects = h.timer(&status_key());
    effects.extend(h.timer(&main_key()));
    assert_eq!(applies(&effects).len(), 1, "the object is busy");
    let after = widget_with_ours(6, json!({"a": "1"}), json!({"f:status": {"f:a": {}}}));
    let effects = h.at(12).applied(&status_key(), Ok(after));
    let body = the_apply(&effects);
    assert_eq!(body["spec"], json!({"colour": "red"}));
    assert_eq!(body["metadata"]["resourceVersion"], "6");
}

#[test]
fn no_more_applies_run_at_once_than_configured() {
    let mut h = Harness::new(Tuning {
        max_concurrent_applies: 2,
        ..trailing()
    });
    let keys: Vec<DesiredKey> = (0..3)
        .map(|i| {
            let mut k = status_key();
            k.object.name = format!("w{i}");
            k
        })
        .collect();
    let mut effects = Vec::new();
    h.cached = Some(fresh_widget());
    for k in &keys {
        h.submit(intent(k, json!({"status": {"a": "1"}})), false);
    }
    h.at(10);
    for k in &keys {
        effects.extend(h.timer(k));
    }
    assert_eq!(applies(&effects).len(), 2);
    assert_eq!(h.machine.pending(), 1);
    let effects = h.applied(
        &keys[0],
        Err(ApplyError::Refused {
            code: 422,
            message: "no".into(),
        }),
    );
    assert_eq!(applies(&effects).len(), 1, "a slot came free");
    assert_eq!(h.machine.pending(), 0);
}

#[test]
fn an_intent_during_an_apply_rides_the_next_one_and_is_answered_by_it() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let (first, _) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    h.at(10).timer(&status_key());
    let (second, effects) = h
        .at(11)
        .submit(intent(&status_key(), json!({"status": {"b": "2"}})), true);
    assert!(answer(&effects, second).is_none());
    let effects = h.at(12).applied(
        &status_key(),
        Ok(widget_with_ours(
            6,
            json!({"a": "1"}),
            json!({"f:status": {"f:a": {}}}),
        )),
    );
    assert_eq!(
        answer(&effects, first).map(|o| o.action),
        Some(Action::applied)
    );
    assert!(answer(&effects, second).is_none());
    let effects = h.at(22).timer(&status_key());
    assert_eq!(the_apply(&effects)["status"], json!({"a": "1", "b": "2"}));
    let effects = h.at(24).applied(
        &status_key(),
        Ok(widget_with_ours(
            7,
            json!({"a": "1", "b": "2"}),
            json!({"f:status": {"f:a": {}, "f:b": {}}}),
        )),
    );
    assert_eq!(
        answer(&effects, second).map(|o| o.action),
        Some(Action::applied)
    );
}

#[test]
fn an_apply_answer_that_shows_another_writers_change_rechecks_the_objects_other_keys() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    h.submit(
        intent(&main_key(), json!({"spec": {"colour": "red"}})),
        false,
    );
    h.at(10).timer(&main_key());
    let spec_applied = |rv: u64, status: Value, managed: &[Managed]| {
        mk_widget(
            rv,
            UID,
            json!({"spec": {"size": 1, "colour": "red"}, "status": status}),
            managed,
        )
    };
    let ours = (
        "widget-spec",
        "Apply",
        "",
        json!({"f:spec": {"f:colour": {}}}),
    );
    h.at(12).applied(
        &main_key(),
        Ok(spec_applied(6, json!({}), std::slice::from_ref(&ours))),
    );
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    let effects = h.at(22).timer(&status_key());
    assert_eq!(applies(&effects).len(), 1);
    // Between the two applies an admin took the colour (version 7); the status apply's
    // answer (8) shows it before the watch does, and the watch's event for 7 is then old.
    let answer = mk_widget(
        8,
        UID,
        json!({"spec": {"size": 1, "colour": "blue"}, "status": {"a": "1"}}),
        &[
            ("admin", "Apply", "", json!({"f:spec": {"f:colour": {}}})),
            (OURS, "Apply", "status", json!({"f:status": {"f:a": {}}})),
        ],
    );
    let effects = h.at(24).applied(&status_key(), Ok(answer));
    assert_eq!(wakes(&effects), vec![h.ms(34)], "{effects:#?}");
    let effects = h.at(34).timer(&main_key());
    assert_eq!(attempts(&effects), vec![Action::conflict], "{effects:#?}");
}

#[test]
fn a_field_another_writer_removed_is_restored_after_the_observation() {
    let mut h = Harness::default();
    h.apply_a1(6);
    // A merge patch removed `status.a`: its ownership went with it.
    let drifted = mk_widget(7, UID, json!({"spec": {"size": 1}}), &[]);
    let effects = h.at(20).observe(drifted);
    assert_eq!(wakes(&effects), vec![h.ms(30)]);
    let effects = h.at(30).timer(&status_key());
    let body = the_apply(&effects);
    assert_eq!(
        (
            body["status"].clone(),
            body["metadata"]["resourceVersion"].clone()
        ),
        (json!({"a": "1"}), json!("7"))
    );
}

#[test]
fn a_change_of_the_object_that_concerns_no_document_sends_nothing() {
    let mut h = Harness::default();
    h.observe(widget_with_ours(
        6,
        json!({"a": "1"}),
        json!({"f:status": {"f:a": {}}}),
    ));
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    h.at(10).timer(&status_key());
    let labelled = mk_widget(
        7,
        UID,
        json!({"spec": {"size": 2}, "status": {"a": "1"}}),
        &[(OURS, "Apply", "status", json!({"f:status": {"f:a": {}}}))],
    );
    h.at(20).observe(labelled);
    let effects = h.at(30).timer(&status_key());
    assert!(applies(&effects).is_empty());
    assert_eq!(attempts(&effects), vec![Action::unchanged]);
}

#[test]
fn an_intent_for_a_recreated_object_drops_the_old_incarnations_document_and_answers_its_waiters() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let mut old = intent(&status_key(), json!({"status": {"a": "old"}}));
    old.uid = Some(UID.into());
    let (old_ticket, _) = h.submit(old, true);
    let recreated = mk_widget(20, "uid-2", json!({}), &[]);
    let mut new = intent(&status_key(), json!({"status": {"b": "new"}}));
    new.uid = Some("uid-2".into());
    let ticket = h.next_ticket;
    h.next_ticket += 1;
    let effects = h.at(3).feed(Event::Intent {
        intent: new,
        ticket,
        wait: true,
        view: Ok(Some(recreated)),
    });
    assert_eq!(
        answer(&effects, old_ticket).map(|o| o.action),
        Some(Action::rejected)
    );
    assert_eq!(
        wakes(&effects),
        vec![h.ms(13)],
        "the new document restarts the window"
    );
    let effects = h.at(13).timer(&status_key());
    let body = the_apply(&effects);
    assert_eq!(
        body["status"],
        json!({"b": "new"}),
        "nothing of the old document"
    );
    assert_eq!(body["metadata"]["uid"], "uid-2");
}

#[test]
fn a_uid_precondition_the_view_lacks_is_read_once_then_rejected() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let mut i = intent(&status_key(), json!({"status": {"a": "1"}}));
    i.uid = Some("uid-gone".into());
    let (ticket, effects) = h.submit(i, true);
    assert_eq!(
        reads(&effects),
        1,
        "the object is read before the intent is merged"
    );
    // The read still shows the other uid: merged into an empty document, then planned.
    h.at(1).observe(fresh_widget());
    let effects = h.at(11).timer(&status_key());
    assert_eq!((reads(&effects), applies(&effects).len()), (1, 0));
    let effects = h.at(12).observe(fresh_widget());
    let outcome = answer(&effects, ticket).expect("answered");
    assert_eq!(outcome.action, Action::rejected);
    assert!(
        outcome
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("uid precondition failed"),
        "{outcome:?}"
    );
    assert!(applies(&effects).is_empty());
}

/// The driver hands over the cached view as it is; an intent naming a uid that view is not
/// of (a recreation the watch has not delivered yet) is the machine's to read for: merged
/// only once the object is read, into what its manager owns on the incarnation it names.
#[test]
fn an_intent_naming_a_uid_the_cached_view_is_not_of_is_merged_after_a_read_of_the_object() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let mut first = intent(&status_key(), json!({"status": {"a": "1"}}));
    first.uid = Some(UID.into());
    h.submit(first, false);
    h.at(10).timer(&status_key());
    let answered = widget_with_ours(7, json!({"a": "1"}), json!({"f:status": {"f:a": {}}}));
    h.at(12).applied(&status_key(), Ok(answered));
    let mut recreated_intent = intent(&status_key(), json!({"status": {"b": "2"}}));
    recreated_intent.uid = Some("uid-2".into());
    let (ticket, effects) = h.at(20).submit(recreated_intent, false);
    assert_eq!(
        reads(&effects),
        1,
        "read for the uid the cache has not seen"
    );
    assert!(
        answer(&effects, ticket).is_none(),
        "not merged before the read"
    );
    let recreated = mk_widget(
        30,
        "uid-2",
        json!({"status": {"owned": "x"}}),
        &[(
            OURS,
            "Apply",
            "status",
            json!({"f:status": {"f:owned": {}}}),
        )],
    );
    let effects = h.at(21).feed(Event::Observed {
        object: object(),
        view: recreated,
    });
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::queued)
    );
    let effects = h.at(31).timer(&status_key());
    let body = the_apply(&effects);
    assert_eq!(
        body["status"],
        json!({"owned": "x", "b": "2"}),
        "what the manager owns on the new incarnation, nothing of the old document"
    );
    assert_eq!(body["metadata"]["uid"], "uid-2");
}

#[test]
fn an_intent_naming_a_uid_whose_read_fails_is_answered_with_an_error_and_merged_nowhere() {
    let mut h = Harness::default();
    h.apply_a1(7);
    let mut refused = intent(&status_key(), json!({"status": {"a": "2"}}));
    refused.uid = Some("recreated".into());
    let (ticket, effects) = h.at(20).submit(refused, true);
    assert_eq!(reads(&effects), 1);
    let effects = h.at(21).feed(Event::ReadFailed {
        object: object(),
        error: ApplyError::Transient("503".into()),
    });
    answered_read_failure(&effects, ticket);
    assert_eq!(
        h.machine.desired()[0].document,
        json!({"status": {"a": "1"}}),
        "not merged"
    );
}

#[test]
fn a_deleted_object_answers_the_waiting_intent_not_found() {
    let mut h = Harness::default();
    let (ticket, effects) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    assert_eq!(reads(&effects), 1, "read before merging");
    let effects = h.at(2).feed(Event::Gone(object()));
    assert_eq!(
        wakes(&effects),
        vec![h.ms(12)],
        "merged into an empty document"
    );
    let effects = h.at(12).timer(&status_key());
    assert_eq!(reads(&effects), 1, "no view to plan on");
    let effects = h.at(13).feed(Event::Gone(object()));
    let outcome = answer(&effects, ticket).expect("answered");
    assert_eq!(outcome.action, Action::rejected);
    assert!(
        outcome
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("not found")
    );
    assert!(wakes(&effects).is_empty(), "not retried");
}

#[test]
fn intents_for_an_object_not_yet_read_share_one_read_and_keep_what_the_manager_owns() {
    let mut h = Harness::default();
    let mut reads_made = 0;
    let mut tickets = Vec::new();
    for i in 0..3 {
        let (ticket, effects) = h.submit(
            intent(&status_key(), json!({"status": {format!("k{i}"): i}})),
            false,
        );
        reads_made += reads(&effects);
        assert!(answer(&effects, ticket).is_none(), "not merged yet");
        tickets.push(ticket);
    }
    assert_eq!(reads_made, 1, "one read for the burst");
    let owned = widget_with_ours(6, json!({"a": "1"}), json!({"f:status": {"f:a": {}}}));
    let effects = h.at(3).feed(Event::Observed {
        object: object(),
        view: owned,
    });
    let actions: Vec<Action> = tickets
        .iter()
        .map(|t| answer(&effects, *t).expect("answered").action)
        .collect();
    assert_eq!(
        actions,
        vec![Action::queued, Action::coalesced, Action::coalesced]
    );
    let effects = h.at(13).timer(&status_key());
    assert_eq!(
        the_apply(&effects)["status"],
        json!({"a": "1", "k0": 0, "k1": 1, "k2": 2}),
        "what the manager owned is kept"
    );
}

#[test]
fn a_failed_read_answers_the_waiting_intents_with_an_error_and_merges_nothing() {
    let mut h = Harness::default();
    let (ticket, _) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    let effects = h.at(2).feed(Event::ReadFailed {
        object: object(),
        error: ApplyError::Transient("503".into()),
    });
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::error)
    );
    assert!(
        h.machine.desired().is_empty(),
        "no document made without the object"
    );
    // The next intent reads again.
    let (_, effects) = h
        .at(5)
        .submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    assert_eq!(reads(&effects), 1);
}

#[test]
fn an_intent_whose_object_the_driver_could_not_read_is_answered_with_an_error_and_merged_nowhere() {
    let mut h = Harness::default();
    h.apply_a1(7);
    // The driver could not look the object up (its kind is unknown to the API server).
    let mut refused = intent(&status_key(), json!({"status": {"a": "2"}}));
    refused.uid = Some("recreated".into());
    let effects = h.at(20).feed(Event::Intent {
        intent: refused,
        ticket: 9,
        wait: true,
        view: Err(ApplyError::Transient("503".into())),
    });
    answered_read_failure(&effects, 9);
    assert!(effects.contains(&Effect::Counted(Count::Intent(
        status_key().field_manager,
        Action::error
    ))));
    assert!(reads(&effects) == 0 && applies(&effects).is_empty());
    assert_eq!(
        h.machine.desired()[0].document,
        json!({"status": {"a": "1"}}),
        "not merged"
    );
}

#[test]
fn a_transient_error_backs_off_exponentially_and_a_changed_document_ends_the_backoff() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    h.at(10).timer(&status_key());
    let effects = h
        .at(11)
        .applied(&status_key(), Err(ApplyError::Transient("503".into())));
    let first = wakes(&effects)[0] - h.ms(11);
    let effects = h.at(11).timer(&status_key());
    assert!(applies(&effects).is_empty(), "not before the backoff");
    h.now = h.ms(11) + first;
    h.timer(&status_key());
    let effects = h.applied(&status_key(), Err(ApplyError::Transient("503".into())));
    let second = wakes(&effects)[0] - h.now;
    assert!(
        first >= Duration::from_millis(100) && first <= Duration::from_millis(300),
        "{first:?}"
    );
    assert!(
        second >= Duration::from_millis(200) && second <= Duration::from_millis(600),
        "{second:?}"
    );
    // An intent that changes the document is tried one window later, not after the backoff.
    let at = h.now;
    let (_, effects) = h.submit(intent(&status_key(), json!({"status": {"a": "2"}})), false);
    assert_eq!(wakes(&effects), vec![at + Duration::from_millis(10)]);
    h.now = at + Duration::from_millis(10);
    assert_eq!(
        the_apply(&h.timer(&status_key()))["status"],
        json!({"a": "2"})
    );
}

#[test]
fn after_a_restart_a_partial_intent_keeps_what_the_manager_owns_on_the_object() {
    let mut h = Harness::default();
    h.observe(widget_with_ours(
        6,
        json!({"a": "1", "b": "2"}),
        json!({"f:status": {"f:a": {}, "f:b": {}}}),
    ));
    h.submit(intent(&status_key(), json!({"status": {"c": "3"}})), false);
    let effects = h.at(10).timer(&status_key());
    assert_eq!(
        the_apply(&effects)["status"],
        json!({"a": "1", "b": "2", "c": "3"})
    );
}

#[test]
fn two_managers_of_this_applier_that_disagree_are_refused_before_any_request() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    let mut other = status_key();
    other.field_manager = "widget-other".into();
    let (ticket, effects) = h.submit(intent(&other, json!({"status": {"a": "2"}})), false);
    let outcome = answer(&effects, ticket).expect("answered at once");
    assert_eq!(outcome.action, Action::conflict);
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::Report { local: true, .. }))
    );
    assert!(wakes(&effects).is_empty());
}

#[test]
fn a_foreign_owner_with_another_value_is_reported_once_and_not_applied() {
    let mut h = Harness::default();
    let theirs = core_owns_the_phase(6);
    h.observe(theirs.clone());
    let (ticket, _) = h.submit(
        intent(&status_key(), json!({"status": {"phase": "Ready"}})),
        true,
    );
    let effects = h.at(10).timer(&status_key());
    assert!(applies(&effects).is_empty(), "nothing else to apply");
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::conflict)
    );
    let reports = effects
        .iter()
        .filter(|e| matches!(e, Effect::Report { local: false, .. }))
        .count();
    assert_eq!(reports, 1);
    // Seen again on the next observation: not reported twice, no request.
    let touched = core_owns_the_phase(7);
    h.at(20).observe(touched);
    let effects = h.at(30).timer(&status_key());
    assert!(applies(&effects).is_empty());
    assert!(!effects.iter().any(|e| matches!(e, Effect::Report { .. })));
}

#[test]
fn an_apply_that_left_a_conflict_out_is_planned_again_on_its_own_answer() {
    let mut h = Harness::default();
    let theirs = core_owns_the_phase(6);
    h.observe(theirs);
    h.submit(
        intent(
            &status_key(),
            json!({"status": {"phase": "Ready", "a": "1"}}),
        ),
        false,
    );
    let effects = h.at(10).timer(&status_key());
    assert_eq!(the_apply(&effects)["status"], json!({"a": "1"}));
    // The answer shows the phase free (its owner let go meanwhile): checked again, applied.
    let answered = widget_with_ours(8, json!({"a": "1"}), json!({"f:status": {"f:a": {}}}));
    let effects = h.at(12).applied(&status_key(), Ok(answered));
    assert_eq!(attempts(&effects), vec![Action::conflict]);
    assert_eq!(wakes(&effects), vec![h.ms(22)]);
    let effects = h.at(22).timer(&status_key());
    assert_eq!(
        the_apply(&effects)["status"],
        json!({"a": "1", "phase": "Ready"})
    );
    // Still in conflict on the answer: one check, no request, no further timer.
    let effects = h.at(24).applied(
        &status_key(),
        Ok(mk_widget(
            9,
            UID,
            json!({"status": {"a": "1", "phase": "Creating"}}),
            &[
                (OURS, "Apply", "status", json!({"f:status": {"f:a": {}}})),
                (
                    "core",
                    "Update",
                    "status",
                    json!({"f:status": {"f:phase": {}}}),
                ),
            ],
        )),
    );
    assert!(applies(&effects).is_empty());
}

#[test]
fn an_apply_the_server_refuses_for_a_null_it_would_leave_keeps_our_values_there_and_applies_the_rest()
 {
    let mut h = Harness::default();
    // `at` is a map another manager owns itself; everything in it is ours.
    let view = mk_widget(
        6,
        UID,
        json!({"status": {"at": {"c": "1"}}}),
        &[
            (
                OURS,
                "Apply",
                "status",
                json!({"f:status": {"f:at": {"f:c": {}}}}),
            ),
            (
                "foreign-u",
                "Update",
                "status",
                json!({"f:status": {"f:at": {}}}),
            ),
        ],
    );
    h.observe(view);
    let (ticket, _) = h.submit(
        intent(
            &status_key(),
            json!({"status": {"at": null, "phase": "Ready"}}),
        ),
        true,
    );
    let effects = h.at(10).timer(&status_key());
    assert_eq!(the_apply(&effects)["status"], json!({"phase": "Ready"}));
    let refused = ApplyError::Refused {
        code: 422,
        message: r#"Widget "w1" is invalid: status.at: Invalid value: "null": must be an object"#
            .into(),
    };
    let effects = h.at(11).applied(&status_key(), Err(refused.clone()));
    assert_eq!(
        the_apply(&effects)["status"],
        json!({"at": {"c": "1"}, "phase": "Ready"}),
        "ours kept at the refused path, the rest applied"
    );
    let done = widget_with_ours(
        7,
        json!({"at": {"c": "1"}, "phase": "Ready"}),
        json!({"f:status": {"f:at": {"f:c": {}}, "f:phase": {}}}),
    );
    let effects = h.at(12).applied(&status_key(), Ok(done));
    let outcome = answer(&effects, ticket).expect("answered");
    assert_eq!(
        (outcome.action, outcome.kept.clone()),
        (Action::applied, vec!["status.at".to_owned()])
    );
    // An intent that changes nothing is answered as the last apply was, the pin included:
    // a submitter learns that our values are still kept there.
    let (same, effects) = h.at(13).submit(
        intent(&status_key(), json!({"status": {"phase": "Ready"}})),
        true,
    );
    let outcome = answer(&effects, same).expect("answered at once");
    assert_eq!(
        (outcome.action, outcome.kept.clone()),
        (Action::unchanged, vec!["status.at".to_owned()])
    );
    // The same refusal again is not retried in a loop: answered as refused.
    let (again, _) = h.at(20).submit(
        intent(&status_key(), json!({"status": {"phase": "Failed"}})),
        true,
    );
    h.at(30).timer(&status_key());
    let effects = h.at(31).applied(&status_key(), Err(refused.clone()));
    assert_eq!(
        applies(&effects).len(),
        1,
        "the document changed: the pin was dropped, and is set again once"
    );
    let effects = h.at(32).applied(&status_key(), Err(refused));
    assert_eq!(
        answer(&effects, again).map(|o| o.action),
        Some(Action::rejected)
    );
}

#[test]
fn an_intent_that_rides_a_queued_check_is_still_told_what_it_kept() {
    let mut h = Harness::new(trailing());
    h.machine = Machine::new(
        Arc::new(Policy {
            protected: vec!["Widget.example.com:status.a".parse().unwrap()],
            ..Policy::default()
        }),
        trailing(),
        7,
    );
    h.apply_a1(6);
    // The watch queues a re-check; the intent that tries to remove the protected path rides it.
    h.at(20).observe(widget_with_ours(
        7,
        json!({"a": "1"}),
        json!({"f:status": {"f:a": {}}}),
    ));
    let (ticket, effects) = h
        .at(21)
        .submit(intent(&status_key(), json!({"status": {"a": null}})), true);
    assert!(
        answer(&effects, ticket).is_none(),
        "it rides the queued check"
    );
    assert_eq!(wakes(&effects), vec![h.ms(31)]);
    let effects = h.at(31).timer(&status_key());
    let outcome = answer(&effects, ticket).expect("answered by the check");
    assert_eq!(
        (outcome.action, outcome.kept.clone()),
        (Action::unchanged, vec!["status.a".to_owned()])
    );
}

// -- views cut down to what planning reads (`crate::view`) ----------------------------------

/// `view` cut down as the driver's cache would with `keep`.
fn stripped(view: &Arc<View>, keep: &crate::view::Keep) -> Arc<View> {
    Arc::new(View::strip(
        view.object(),
        Arc::new(keep.clone()),
        &compact_json::Dictionaries::default(),
    ))
}

/// The one `Keep` among `effects`, and where it is among them.
fn the_keep(effects: &[Effect]) -> (usize, crate::view::Keep) {
    let found: Vec<(usize, &crate::view::Keep)> = effects
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Effect::Keep { keep, .. } => Some((i, keep)),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "one keep expected: {effects:#?}");
    (found[0].0, found[0].1.clone())
}

#[test]
fn a_first_intent_on_a_view_cut_without_its_manager_waits_for_a_read_that_keeps_it() {
    let mut h = Harness::default();
    // The watch cut the widget before anyone asked for our manager: its identity alone.
    let whole = widget_with_ours(6, json!({"a": "1"}), json!({"f:status": {"f:a": {}}}));
    h.observe(stripped(&whole, &crate::view::Keep::default()));
    let (ticket, effects) = h.submit(intent(&status_key(), json!({"status": {"b": "2"}})), true);
    let (at, keep) = the_keep(&effects);
    assert_eq!(keep.managers, [OURS.to_string()].into());
    let read = effects
        .iter()
        .position(|e| matches!(e, Effect::Read(_)))
        .expect("a read");
    assert!(at < read, "the keep comes before the read that needs it");
    assert!(answer(&effects, ticket).is_none(), "nothing merged yet");
    // The read, cut down as asked: `a` stays in the document.
    h.at(2).observe(stripped(&whole, &keep));
    let effects = h.at(12).timer(&status_key());
    assert_eq!(
        the_apply(&effects)["status"],
        json!({"a": "1", "b": "2"}),
        "no field of ours lost"
    );
}

/// The widget as our apply of `status.a` left it (core owns the phase).
fn ours_applied_a() -> Arc<View> {
    mk_widget(
        7,
        UID,
        json!({"status": {"phase": "Creating", "a": "1"}}),
        &[
            (
                "core",
                "Update",
                "status",
                json!({"f:status": {"f:phase": {}}}),
            ),
            (OURS, "Apply", "status", json!({"f:status": {"f:a": {}}})),
        ],
    )
}

#[test]
fn a_document_claiming_beyond_the_view_is_planned_only_on_a_read_that_keeps_its_paths() {
    let mut h = Harness::default();
    let ours = crate::view::Keep::managers([OURS.to_string()]);
    // Core owns the phase; the view kept nothing of it (ours owns nothing yet).
    let whole = core_owns_the_phase(6);
    let cut = stripped(&whole, &ours);
    assert!(cut.object().data.get("status").is_none());
    h.observe(cut);
    let (ticket, _) = h.submit(
        intent(
            &status_key(),
            json!({"status": {"phase": "Ready", "a": "1"}}),
        ),
        true,
    );
    let effects = h.at(10).timer(&status_key());
    assert!(applies(&effects).is_empty(), "not planned blind");
    assert_eq!(reads(&effects), 1);
    let (_, keep) = the_keep(&effects);
    assert!(keep.managers.contains(OURS));
    // The read keeps the phase and its owner: the conflict is predicted, `a` applied.
    let effects = h.at(11).observe(stripped(&whole, &keep));
    let body = the_apply(&effects);
    assert_eq!(body["status"], json!({"a": "1"}));
    let answered = h
        .at(12)
        .applied(&status_key(), Ok(stripped(&ours_applied_a(), &keep)));
    let outcome = answer(&answered, ticket).expect("answered");
    assert_eq!(outcome.action, Action::conflict);
    assert_eq!(outcome.conflicts[0].owner, "core");
}

#[test]
fn claims_are_released_once_an_apply_made_their_manager_own_them() {
    let mut h = Harness::default();
    let ours = crate::view::Keep::managers([OURS.to_string()]);
    // Core owns the phase; ours owns nothing yet, so `a` is a claim the views must keep.
    let whole = core_owns_the_phase(6);
    h.observe(stripped(&whole, &ours));
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    let effects = h.at(10).timer(&status_key());
    let (_, keep) = the_keep(&effects);
    assert!(!keep.claimed.is_empty(), "{keep:?}");
    let effects = h.at(11).observe(stripped(&whole, &keep));
    assert_eq!(the_apply(&effects)["status"], json!({"a": "1"}));
    // The apply's answer: ours owns `a` now, kept with its applies; the claim need not stay.
    let answered = h
        .at(12)
        .applied(&status_key(), Ok(stripped(&ours_applied_a(), &keep)));
    let (_, released) = the_keep(&answered);
    assert_eq!(released, ours);
}

#[test]
fn a_read_of_the_same_version_cut_to_what_was_asked_last_is_planned_on() {
    let mut h = Harness::default();
    // Held: the widget cut to ours and `status.x` (what an earlier document claimed).
    let whole = core_owns_the_phase(6);
    let earlier = crate::view::Keep {
        managers: [OURS.to_string()].into(),
        claimed: managed_fields::FieldSet::from_fields_v1(&json!({"f:status": {"f:x": {}}}))
            .unwrap(),
    };
    h.observe(stripped(&whole, &earlier));
    h.submit(
        intent(&status_key(), json!({"status": {"phase": "Ready"}})),
        false,
    );
    let effects = h.at(10).timer(&status_key());
    let (_, asked) = the_keep(&effects);
    assert_eq!(reads(&effects), 1);
    // The read finds the same version, cut to what was asked now (not a superset of before).
    let effects = h.at(11).observe(stripped(&whole, &asked));
    assert_eq!(reads(&effects), 0, "no second read: {effects:#?}");
    assert_eq!(attempts(&effects), vec![Action::conflict], "{effects:#?}");
}

/// The widget at `resource_version` and `generation` after `widget-spec` applied `colour`.
fn coloured(resource_version: u64, generation: i64, colour: &str) -> Arc<View> {
    let object = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "team-a", "uid": UID,
            "resourceVersion": resource_version.to_string(), "generation": generation,
            "managedFields": [{"manager": "widget-spec", "operation": "Apply",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:colour": {}}}}]},
        "spec": {"size": 1, "colour": colour},
    }))
    .expect("a widget");
    Arc::new(View::whole(object))
}

#[test]
fn an_answer_tells_the_generation_the_apply_left_the_object_at() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    let (ticket, _) = h.submit(
        intent(&main_key(), json!({"spec": {"colour": "red"}})),
        true,
    );
    h.at(10).timer(&main_key());
    // A spec write makes a new generation: the publisher learns it from the answer, before
    // its own watch shows the object again.
    let effects = h.at(12).applied(&main_key(), Ok(coloured(6, 2, "red")));
    let outcome = answer(&effects, ticket).expect("answered");
    assert_eq!(outcome.action, Action::applied);
    assert_eq!(outcome.resource_version.as_deref(), Some("6"));
    assert_eq!(outcome.generation, Some(2));

    // Nothing left to change: the answer tells the generation it checked.
    let (ticket, mut effects) = h.at(30).submit(
        intent(&main_key(), json!({"spec": {"colour": "blue"}})),
        true,
    );
    effects.extend(h.at(40).timer(&main_key()));
    assert_eq!(applies(&effects).len(), 1);
    let effects = h.at(42).applied(&main_key(), Ok(coloured(7, 3, "blue")));
    assert_eq!(answer(&effects, ticket).and_then(|o| o.generation), Some(3));
    let (ticket, mut effects) = h.at(60).submit(
        intent(&main_key(), json!({"spec": {"colour": "blue"}})),
        true,
    );
    effects.extend(h.at(70).timer(&main_key()));
    assert!(applies(&effects).is_empty());
    let outcome = answer(&effects, ticket).expect("answered without an apply");
    assert_eq!(outcome.action, Action::unchanged);
    assert_eq!(outcome.generation, Some(3));
}

mod leadership;

#[test]
fn a_deleted_object_is_forgotten_once_its_keys_have_nothing_left_to_do() {
    let mut h = Harness::default();
    h.apply_a1(6);
    assert_eq!(h.machine.desired().len(), 1);
    assert_eq!(h.machine.objects_held(), 1);
    let effects = h.at(20).feed(Event::Gone(object()));
    assert!(
        h.machine.desired().is_empty(),
        "the deleted object's document is forgotten"
    );
    assert_eq!(h.machine.objects_held(), 0, "and the object with it");
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::Forget(o) if *o == object())),
        "the views forget what they kept of it"
    );
}

#[test]
fn a_deleted_object_with_an_intent_still_queued_is_kept_until_that_is_done() {
    let mut h = Harness::default();
    h.apply_a1(6);
    h.at(20)
        .submit(intent(&status_key(), json!({"status": {"a": "2"}})), false);
    h.at(21).feed(Event::Gone(object()));
    assert_eq!(h.machine.desired().len(), 1, "queued: not forgotten yet");
}
