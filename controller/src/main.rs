//! `capt-controller`: wiring only (the reconcilers arrive with the controller issue).
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    anyhow::bail!("capt-controller: the reconcilers are not implemented yet")
}
