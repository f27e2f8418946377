//! Prints the YAML of every CRD this project defines, generated from the Rust types.
//! `cargo run -p capt-controller --bin crdgen -- manifests/crds` writes one file per CRD.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    let out = std::env::args().nth(1);
    for (file, yaml) in capt_controller::api::crd_files()? {
        match &out {
            Some(dir) => std::fs::write(std::path::Path::new(dir).join(&file), yaml)?,
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}
