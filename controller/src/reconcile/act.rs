//! Carries out a [`Plan`]: each step in order, the first failure ending it (the steps
//! before it stay done, and the retry decides again from what it then observes). It knows no
//! rule of CAPT: what to write, and in which order, is the plan's.

use super::Result;
use super::plan::{Next, Plan, Step};
use crate::context::Context;
use kube::runtime::controller::Action;

/// Carries out `plan`; returns when to reconcile again.
pub async fn carry_out(ctx: &Context, plan: Plan) -> Result<Action> {
    for step in plan.steps {
        match step {
            Step::Publish(publication) => {
                ctx.publish(publication).await?;
            }
        }
    }
    Ok(match plan.next {
        Next::AwaitChange => Action::await_change(),
        Next::After(after) => Action::requeue(after),
    })
}
