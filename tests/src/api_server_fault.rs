//! Faults of the shared test API server (`hack/testenv.sh apiserver-stop|apiserver-freeze`),
//! undone when dropped: a test that fails during the fault must not leave the API server down
//! or frozen for the test binaries that run after it.

use anyhow::{Result, ensure};

/// The API server stopped or frozen until [`ApiServerFault::end`], or until dropped.
pub struct ApiServerFault {
    undo: &'static str,
    ended: bool,
}

impl ApiServerFault {
    /// The API server stopped (its process ended); [`ApiServerFault::end`] starts it again.
    pub fn stop() -> Result<Self> {
        Self::begin("apiserver-stop", "apiserver-start")
    }

    /// The API server frozen (SIGSTOP: connections stay open, nothing is answered);
    /// [`ApiServerFault::end`] thaws it.
    pub fn freeze() -> Result<Self> {
        Self::begin("apiserver-freeze", "apiserver-thaw")
    }

    fn begin(command: &str, undo: &'static str) -> Result<Self> {
        // Made first: a fault that fails half-way is also undone.
        let fault = Self { undo, ended: false };
        testenv(command)?;
        Ok(fault)
    }

    /// Undoes the fault.
    pub fn end(mut self) -> Result<()> {
        self.ended = true;
        testenv(self.undo)
    }
}

impl Drop for ApiServerFault {
    fn drop(&mut self) {
        if !self.ended {
            eprintln!("the test failed during an API server fault: {}", self.undo);
            if let Err(e) = testenv(self.undo) {
                eprintln!("{e:#}");
            }
        }
    }
}

/// Runs `hack/testenv.sh COMMAND` against the running environment.
pub fn testenv(command: &str) -> Result<()> {
    let out = std::process::Command::new(crate::repo_root().join("hack/testenv.sh"))
        .arg(command)
        .env("KUBECONFIG", &crate::env().kubeconfig)
        .output()?;
    ensure!(
        out.status.success(),
        "hack/testenv.sh {command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
