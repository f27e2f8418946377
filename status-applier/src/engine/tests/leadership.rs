//! Event sequences of a replica's leadership ([`leadership`]): only the leader's
//! applier writes, and one that stops leading follows the next leader's writes.

use super::*;
use ::leadership::Leadership;

fn lead(h: &mut Harness, leadership: Leadership) -> Vec<Effect> {
    h.feed(Event::Leadership(leadership))
}

/// This replica leads until `ms` after the start.
fn lead_until(h: &mut Harness, ms: u64) -> Vec<Effect> {
    let until = h.ms(ms);
    lead(h, Leadership::Until(until))
}

fn pod_b_leads() -> Leadership {
    Leadership::Follower {
        leader: "pod-b".into(),
    }
}

/// The widget after the other replica's applier wrote `status.a` under our manager's name.
fn written_by_the_other_replica(resource_version: u64, a: &str) -> Arc<View> {
    widget_with_ours(
        resource_version,
        json!({"a": a}),
        json!({"f:status": {"f:a": {}}}),
    )
}

#[test]
fn a_follower_refuses_intents_and_sends_nothing() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    lead(&mut h, pod_b_leads());
    let (ticket, effects) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    let outcome = answer(&effects, ticket).expect("answered at once");
    assert_eq!(outcome.action, Action::error, "not delivered: {outcome:?}");
    assert!(
        outcome
            .message
            .as_deref()
            .is_some_and(|m| m.contains("pod-b leads")),
        "{outcome:?}"
    );
    assert!(applies(&effects).is_empty() && wakes(&effects).is_empty());
    assert!(h.machine.desired().is_empty(), "no document kept");
}

#[test]
fn a_replica_that_stops_leading_follows_the_new_leaders_writes_instead_of_restoring_its_own() {
    let mut h = Harness::default();
    h.apply_a1(6);
    lead(&mut h, pod_b_leads());
    // The new leader's applier writes another value under the same manager: before, this
    // replica took it for drift and restored "1", and the two flipped the field for ever.
    let effects = h.at(20).observe(written_by_the_other_replica(7, "2"));
    assert!(applies(&effects).is_empty(), "{effects:#?}");
    assert!(wakes(&effects).is_empty(), "nothing queued: {effects:#?}");
    let effects = h.at(40).timer(&status_key());
    assert!(applies(&effects).is_empty(), "{effects:#?}");
    assert_eq!(
        h.machine.desired()[0].document,
        json!({"status": {"a": "2"}}),
        "the document follows the object"
    );
}

#[test]
fn standing_by_drops_the_documents_of_intents_at_once() {
    let mut h = Harness::default();
    h.apply_a1(6);
    h.at(20)
        .submit(intent(&status_key(), json!({"status": {"a": "3"}})), false);
    lead(&mut h, pod_b_leads());
    assert_eq!(
        h.machine.desired()[0].document,
        json!({"status": {"a": "1"}}),
        "what the object holds, not what the last intent asked for"
    );
    assert_eq!(h.machine.pending(), 0);
    assert!(applies(&h.at(30).timer(&status_key())).is_empty());
}

#[test]
fn a_lease_not_renewed_in_time_holds_applies_until_it_is_renewed() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    lead_until(&mut h, 5);
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    let effects = h.at(10).timer(&status_key());
    assert!(applies(&effects).is_empty(), "the lease ran out at 5 ms");
    h.at(20);
    let effects = lead_until(&mut h, 1_000);
    assert_eq!(the_apply(&effects)["status"], json!({"a": "1"}));
}

#[test]
fn an_apply_replanned_after_the_lease_ran_out_is_held_not_sent() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    lead_until(&mut h, 15);
    h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), false);
    h.at(10).timer(&status_key());
    // Refused as stale at 20 ms, after the lease ran out: the fresh read is not planned on.
    let effects = h.at(20).applied(&status_key(), Err(ApplyError::Stale));
    assert_eq!(reads(&effects), 1);
    let effects = h.at(21).observe(core_owns_the_phase(8));
    assert!(applies(&effects).is_empty(), "{effects:#?}");
    h.at(30);
    let effects = lead_until(&mut h, 1_000);
    assert_eq!(the_apply(&effects)["metadata"]["resourceVersion"], "8");
}

#[test]
fn submitters_waiting_when_another_replica_takes_over_hear_that_nothing_was_applied() {
    let mut h = Harness::default();
    h.observe(fresh_widget());
    lead_until(&mut h, 5);
    let (ticket, _) = h.submit(intent(&status_key(), json!({"status": {"a": "1"}})), true);
    h.at(10).timer(&status_key());
    let effects = h.at(20).feed(Event::Leadership(pod_b_leads()));
    assert_eq!(
        answer(&effects, ticket).map(|o| o.action),
        Some(Action::error)
    );
    h.at(30);
    let effects = lead_until(&mut h, 1_000);
    assert!(
        applies(&effects).is_empty(),
        "the leader's pod applies it, not this one"
    );
}

#[test]
fn a_replica_that_takes_over_applies_its_intents_on_what_the_object_holds() {
    let mut h = Harness::default();
    lead(&mut h, pod_b_leads());
    h.observe(written_by_the_other_replica(7, "2"));
    lead_until(&mut h, 60_000);
    h.submit(intent(&status_key(), json!({"status": {"b": "1"}})), false);
    let effects = h.at(10).timer(&status_key());
    assert_eq!(
        the_apply(&effects)["status"],
        json!({"a": "2", "b": "1"}),
        "nothing the other replica wrote is reverted or dropped"
    );
}
