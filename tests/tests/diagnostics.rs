//! The diagnostics listeners of both binaries against the real API server (the
//! `diagnostics` crate; `docs/status-applier.md`, "Diagnostics"):
//!
//! - metrics over HTTPS, for authorized scrapers only: no or an invalid token gets 401, a
//!   ServiceAccount token without the `capt-controller-metrics-reader` binding 403, one with
//!   it 200 and the real metrics; both processes run as the manifests' ServiceAccount, so
//!   the shipped RBAC is what lets them ask the TokenReview and SubjectAccessReview;
//! - the probes on a plain port of their own, which serves nothing else;
//! - the status-applier's debug listener refuses any address but loopback;
//! - the status-applier's socket carries its final mode from the moment it appears.
//! - hole 7 of `docs/security.md`, against a running status-applier: `/readyz` asks the API
//!   server once a second at most, 4 token reviews at a time, 32 TLS handshakes at a time.
//!
//! Scrapes go through `curl` (a requirement of the test environment), so the TLS is a real
//! client's.

use anyhow::{Context, Result, bail};
use capt_tests::applier::{Applier, binary, metric_value};
use capt_tests::audit_log::AuditLog;
use capt_tests::held_proxy::HeldProxy;
use capt_tests::system::{free_local_addr, free_local_addrs, impersonating_kubeconfig, plain_get};
use capt_tests::{Scratch, ScratchFile, TestNamespace, env, repo_root, unique_name};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The manifests' namespace and RBAC (the pod's ServiceAccount, its metrics-auth role, and
/// the metrics-reader role scrapers are bound to).
fn install_rbac() -> Result<()> {
    let deploy = repo_root().join("manifests/deploy");
    for file in ["namespace.yaml", "rbac.yaml"] {
        let path = deploy.join(file);
        env().kubectl_ok(
            &["apply", "--server-side", "-f", path.to_str().unwrap()],
            None,
        )?;
    }
    Ok(())
}

/// A kubeconfig acting as the pod's ServiceAccount, `capt-system/capt-controller`.
fn pod_kubeconfig() -> Result<ScratchFile> {
    install_rbac()?;
    let dir = Scratch::new("diagnostics")?;
    let path = impersonating_kubeconfig("system:serviceaccount:capt-system:capt-controller", &dir)?;
    Ok(ScratchFile::new(dir, path))
}

/// Two scrapers' tokens: `reader`, bound to `capt-controller-metrics-reader`, and
/// `stranger`, bound to nothing. The binding is deleted when dropped.
struct Scrapers {
    _ns: TestNamespace,
    binding: String,
    reader: String,
    stranger: String,
}

impl Scrapers {
    async fn create() -> Result<Self> {
        let client = env().client().await?;
        let ns = TestNamespace::create(&client, "scrapers").await?;
        let binding = format!("{}-metrics-reader", ns.name);
        let objects = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "reader", "namespace": ns.name}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "stranger", "namespace": ns.name}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": binding},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "capt-controller-metrics-reader"},
             "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns.name}]},
        ]});
        env().kubectl_ok(&["apply", "-f", "-"], Some(&objects.to_string()))?;
        // Tokens from the TokenRequest API, as a scraper's projected token would be.
        let token = |account: &str| -> Result<String> {
            Ok(env()
                .kubectl_ok(&["create", "token", account, "-n", &ns.name], None)?
                .trim()
                .to_owned())
        };
        let (reader, stranger) = (token("reader")?, token("stranger")?);
        Ok(Self {
            _ns: ns,
            binding,
            reader,
            stranger,
        })
    }
}

impl Drop for Scrapers {
    fn drop(&mut self) {
        let _ = env().kubectl_run(
            &[
                "delete",
                "clusterrolebinding",
                &self.binding,
                "--ignore-not-found",
            ],
            None,
        );
    }
}

/// How to trust the metrics listener's certificate.
#[derive(Clone, Copy)]
enum Trust<'a> {
    /// Its self-signed certificate: no verification (`curl -k`).
    Anything,
    /// Verify against this CA file.
    Ca(&'a Path),
    /// The system's CAs (curl's default).
    System,
}

/// `curl https://<addr>/metrics` with `token`: the status code (0 when no HTTP answer) and
/// the body, or curl's exit code when it failed.
fn scrape(addr: &str, trust: Trust, token: Option<&str>) -> Result<Result<(u16, String), i32>> {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"]);
    match trust {
        Trust::Anything => {
            curl.arg("-k");
        }
        Trust::Ca(ca) => {
            curl.arg("--cacert").arg(ca);
        }
        Trust::System => {}
    }
    if let Some(token) = token {
        curl.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = curl
        .arg(format!("https://{addr}/metrics"))
        .stdin(Stdio::null())
        .output()
        .context("running curl")?;
    if !out.status.success() {
        return Ok(Err(out.status.code().unwrap_or(-1)));
    }
    let text = String::from_utf8(out.stdout)?;
    let (body, code) = text.rsplit_once('\n').context("curl wrote no status")?;
    Ok(Ok((code.trim().parse()?, body.to_owned())))
}

/// The status code of an HTTPS scrape that got an answer.
fn scrape_status(addr: &str, trust: Trust, token: Option<&str>) -> Result<u16> {
    match scrape(addr, trust, token)? {
        Ok((status, _)) => Ok(status),
        Err(code) => bail!("curl https://{addr}/metrics failed with exit code {code}"),
    }
}

/// Every `# TYPE` line of a Prometheus text.
fn families(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    lines.sort();
    lines
}

/// The sample templates and Cluster of `manifests/samples/`, in `namespace`.
fn apply_samples(namespace: &str) -> Result<()> {
    let samples = repo_root().join("manifests/samples");
    let mut docs = Vec::new();
    for file in ["templates.yaml", "cluster.yaml"] {
        let text = std::fs::read_to_string(samples.join(file))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
            v["metadata"]["namespace"] = serde_json::Value::from(namespace);
            docs.push(v.to_string());
        }
    }
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&docs.join("\n")),
    )?;
    Ok(())
}

/// Waits until the listener at `addr` accepts connections.
async fn wait_listening(addr: &str, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            bail!("{what} did not listen on {addr} within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The 401/403/200 ladder against a metrics listener; the 200's body is returned.
fn assert_only_authorized_scrapers(
    addr: &str,
    trust: Trust,
    scrapers: &Scrapers,
) -> Result<String> {
    assert_eq!(scrape_status(addr, trust, None)?, 401, "no token");
    assert_eq!(
        scrape_status(addr, trust, Some("not-a-token"))?,
        401,
        "an invalid token"
    );
    assert_eq!(
        scrape_status(addr, trust, Some(&scrapers.stranger))?,
        403,
        "a ServiceAccount not bound to capt-controller-metrics-reader"
    );
    let (status, body) = scrape(addr, trust, Some(&scrapers.reader))?
        .map_err(|code| anyhow::anyhow!("curl failed with exit code {code}"))?;
    assert_eq!(status, 200, "the bound ServiceAccount: {body}");
    // Again, from the cache, and still the same answers.
    assert_eq!(scrape_status(addr, trust, Some(&scrapers.reader))?, 200);
    assert_eq!(scrape_status(addr, trust, Some(&scrapers.stranger))?, 403);
    Ok(body)
}

#[tokio::test]
async fn the_status_applier_serves_metrics_over_https_to_authorized_scrapers_only() -> Result<()> {
    let kubeconfig = pod_kubeconfig()?;
    let scrapers = Scrapers::create().await?;
    let [metrics_addr, probe_addr] = free_local_addrs()?;
    let applier = Applier::start_as(
        &[
            "--metrics-bind-address",
            &metrics_addr,
            "--health-probe-bind-address",
            &probe_addr,
        ],
        &kubeconfig,
    )
    .await?;
    wait_listening(&metrics_addr, "the applier's metrics").await?;

    let body = assert_only_authorized_scrapers(&metrics_addr, Trust::Anything, &scrapers)?;
    // The same metrics as on the socket (only the listener changed).
    let socket = applier.client.get("/metrics").await?.body;
    assert!(
        body.contains("# TYPE status_applier_pending_documents gauge"),
        "{body}"
    );
    assert_eq!(families(&body), families(&socket));

    // Self-signed: a client that verifies refuses it (curl 60: peer certificate not trusted).
    assert_eq!(
        scrape(&metrics_addr, Trust::System, Some(&scrapers.reader))?,
        Err(60)
    );
    // No plain HTTP on the metrics port.
    let plain = plain_get(&metrics_addr, "/metrics").await;
    assert!(
        plain.as_ref().is_err() || plain.as_ref().is_ok_and(|(s, _)| *s != 200),
        "plain HTTP got {plain:?}"
    );

    // The probes: plain HTTP, their own port, nothing else there.
    assert_eq!(plain_get(&probe_addr, "/healthz").await?.0, 200);
    let ready = Instant::now() + Duration::from_secs(20);
    while plain_get(&probe_addr, "/readyz").await?.0 != 200 {
        assert!(Instant::now() < ready, "/readyz never answered 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(plain_get(&probe_addr, "/metrics").await?.0, 404);
    assert_eq!(plain_get(&probe_addr, "/v1/intents").await?.0, 404);
    Ok(())
}

#[tokio::test]
async fn the_controller_serves_metrics_with_the_certificate_of_its_cert_dir() -> Result<()> {
    let kubeconfig = pod_kubeconfig()?;
    let scrapers = Scrapers::create().await?;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "diag-controller").await?;
    let dir = capt_tests::Scratch::new("controller-cert")?;
    // A certificate for 127.0.0.1, as cert-manager would mount one.
    let openssl = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=capt-controller-metrics",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .output()?;
    assert!(
        openssl.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&openssl.stderr)
    );
    let [metrics_addr, probe_addr] = free_local_addrs()?;
    let log = dir.join("controller.log");
    let _controller = KilledOnDrop {
        child: Command::new(binary("capt-controller"))
            .args(["--namespace", &ns.name, "--no-leader-election"])
            .args(["--metrics-bind-address", &metrics_addr])
            .args(["--health-probe-bind-address", &probe_addr])
            .arg("--metrics-cert-dir")
            .arg(&dir)
            .arg("--applier-socket")
            .arg(dir.join("no-applier.sock"))
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?,
        log,
    };
    wait_listening(&metrics_addr, "the controller's metrics").await?;
    // Verified against the mounted certificate: that is the one served.
    let ca = dir.join("tls.crt");
    assert_only_authorized_scrapers(&metrics_addr, Trust::Ca(&ca), &scrapers)?;
    // Real metrics: the sample's objects are reconciled and counted.
    apply_samples(&ns.name)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scraped = scrape(&metrics_addr, Trust::Ca(&ca), Some(&scrapers.reader))?;
        let (status, body) = scraped.map_err(|code| anyhow::anyhow!("curl exit {code}"))?;
        assert_eq!(status, 200, "{body}");
        if metric_value(&body, "capt_reconciles_total", &["kind=\"CAPTCluster\""])? > 0.0 {
            assert!(body.contains("# TYPE capt_reconciles counter"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "no reconcile counted: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(plain_get(&probe_addr, "/healthz").await?.0, 200);
    // Ready only with a status-applier, and there is none: the probe says so.
    let (status, why) = plain_get(&probe_addr, "/readyz").await?;
    assert_eq!(status, 503, "{why}");
    assert_eq!(plain_get(&probe_addr, "/metrics").await?.0, 404);
    Ok(())
}

/// A process killed when dropped; its log printed when a test fails.
struct KilledOnDrop {
    child: std::process::Child,
    log: PathBuf,
}

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

#[tokio::test]
async fn the_debug_listener_refuses_any_address_but_loopback() -> Result<()> {
    let dir = capt_tests::Scratch::new("debug-tcp")?;
    for addr in [
        "0.0.0.0:9999",
        "[::]:9999",
        "192.0.2.1:9999",
        "[2001:db8::1]:9999",
    ] {
        let socket = dir.join("applier.sock");
        let out = Command::new(binary("status-applier"))
            .args(["serve", "--debug-tcp-addr", addr, "--socket"])
            .arg(&socket)
            .env("KUBECONFIG", &env().kubeconfig)
            .stdin(Stdio::null())
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{addr} was accepted");
        assert!(
            stderr.contains("--debug-tcp-addr")
                && stderr.contains(addr)
                && stderr.contains("not a loopback address"),
            "{addr}: {stderr}"
        );
        assert!(!socket.exists(), "{addr}: it served before refusing");
    }
    // Loopback is served: the whole API.
    let debug = free_local_addr()?;
    let _applier = Applier::start(&["--debug-tcp-addr", &debug]).await?;
    wait_listening(&debug, "the debug listener").await?;
    assert_eq!(plain_get(&debug, "/v1/intents").await?.0, 200);
    Ok(())
}

/// What the first look at a socket that `serve` creates saw.
#[derive(Debug)]
struct FirstView {
    mode: u32,
    connects: bool,
    beside: Vec<String>,
}

/// Starts `command` (a `status-applier serve --socket <dir>/applier.sock`, perhaps under
/// strace), looks at the socket as often as it can until it appears, and kills the
/// status-applier (`pid_of` finds it from the spawned child).
async fn first_view(
    dir: &Path,
    mut command: Command,
    pid_of: impl Fn(u32) -> Option<u32>,
) -> Result<FirstView> {
    let socket = dir.join("applier.sock");
    // A stale file from an earlier run, with another mode: it is replaced.
    std::fs::write(&socket, "stale")?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o644))?;
    let log = dir.join("serve.log");
    let mut child = command
        .env("KUBECONFIG", &env().kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match std::fs::symlink_metadata(&socket) {
            Ok(meta) if meta.file_type().is_socket() => break Some(meta),
            _ if Instant::now() > deadline => break None,
            _ => std::hint::spin_loop(),
        }
    };
    let connects = tokio::net::UnixStream::connect(&socket).await.is_ok();
    // What is left beside the socket once `serve` is done binding it (it logs this after).
    while first.is_some()
        && Instant::now() < deadline
        && !std::fs::read_to_string(&log)?.contains("Serving the intent API")
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let beside = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| !name.as_ref().is_ok_and(|n| n == "serve.log"))
        .collect::<std::io::Result<_>>()?;
    if let Some(pid) = pid_of(child.id()).filter(|pid| *pid != child.id()) {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
    }
    let _ = child.kill();
    let _ = child.wait();
    let first = first.context("no socket within 20 s")?;
    Ok(FirstView {
        mode: first.permissions().mode() & 0o7777,
        connects,
        beside,
    })
}

fn serve_on(dir: &Path, program: &Path, before: &[&str]) -> Command {
    let mut command = Command::new(program);
    command
        .args(before)
        .arg(binary("status-applier"))
        .args(["serve", "--socket"])
        .arg(dir.join("applier.sock"));
    command
}

fn assert_final_mode(view: &FirstView, how: &str) {
    assert_eq!(
        view.mode, 0o660,
        "{how}: the socket appeared with mode {:o}",
        view.mode
    );
    assert!(view.connects, "{how}: the socket is served");
    assert_eq!(
        view.beside,
        ["applier.sock"],
        "{how}: nothing else is left beside it"
    );
}

#[tokio::test]
async fn the_socket_has_its_final_mode_from_the_moment_it_appears() -> Result<()> {
    // As it runs: the first view must already have the mode. A bind followed by a chmod
    // leaves a window of microseconds, which this look catches only by luck ...
    let dir = capt_tests::Scratch::new("socket-mode")?;
    let command = serve_on(&dir, Path::new("env"), &[]);
    assert_final_mode(&first_view(&dir, command, |_| None).await?, "as it runs");

    // ... so, again with every chmod delayed by one second (strace's fault injection): a
    // socket bound on its path before its chmod would show its umask mode for that second.
    // Without strace this check cannot run, and a check that does not run must not pass:
    // .ci/run installs strace.
    let probe = Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "true"])
        .output()
        .context("strace is required for the slowed-down run (apt-get install strace)")?;
    anyhow::ensure!(
        probe.status.success(),
        "strace cannot trace here ({}): the slowed-down run needs it: {}",
        probe.status,
        String::from_utf8_lossy(&probe.stderr)
    );
    let dir = capt_tests::Scratch::new("socket-mode-slow")?;
    let slowed = [
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-e",
        "trace=chmod,fchmodat",
        "-e",
        "inject=chmod,fchmodat:delay_enter=1000000",
    ];
    let command = serve_on(&dir, Path::new("strace"), &slowed);
    // The status-applier is strace's child.
    let tracee = |strace: u32| {
        std::fs::read_to_string(format!("/proc/{strace}/task/{strace}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    assert_final_mode(
        &first_view(&dir, command, tracee).await?,
        "with every chmod slowed down",
    );
    Ok(())
}

/// The reviews the documented cap allows at a time (`docs/security.md`, hole 7).
const REVIEWS_AT_A_TIME: usize = 4;
/// The TLS handshakes the documented cap allows at a time on a metrics port.
const HANDSHAKES_AT_A_TIME: usize = 32;

/// A status-applier acting as pod `pod` of the Deployment (the audit log's
/// `impersonatedUser.extra.pod`), with its metrics and probe listeners, through `kubeconfig`.
async fn applier_as_pod(
    kubeconfig: &Path,
    metrics_addr: &str,
    probe_addr: &str,
) -> Result<Applier> {
    let applier = Applier::start_as(
        &[
            "--metrics-bind-address",
            metrics_addr,
            "--health-probe-bind-address",
            probe_addr,
        ],
        kubeconfig,
    )
    .await?;
    wait_listening(metrics_addr, "the applier's metrics").await?;
    let ready = Instant::now() + Duration::from_secs(20);
    while plain_get(probe_addr, "/readyz").await?.0 != 200 {
        assert!(Instant::now() < ready, "/readyz never answered 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(applier)
}

/// A kubeconfig acting as the pod's ServiceAccount with `pod` as the user extra `pod`.
fn kubeconfig_of_pod(pod: &str) -> Result<ScratchFile> {
    install_rbac()?;
    let dir = Scratch::new(pod)?;
    let path = capt_tests::pod::pod_kubeconfig(pod, &dir)?;
    Ok(ScratchFile::new(dir, path))
}

/// Hole 7 of the hostile-tenant review: whoever reaches the metrics port makes the pod ask the
/// API server a TokenReview per token it sends. A proxy holds the API server's side, so the
/// reviews asked stay in flight: of 20 scrapes with random tokens at once, 4 are reviewed
/// and 16 are answered 503 without a review; once let go, the 4 are answered 401, and the
/// API server's audit log shows 4 TokenReviews from this pod.
#[tokio::test]
async fn hole7_random_tokens_get_at_most_four_token_reviews_at_a_time() -> Result<()> {
    const SCRAPES: usize = 20; // under the handshake cap: every scrape gets its TLS
    let pod = unique_name("reviews");
    let kubeconfig = kubeconfig_of_pod(&pod)?;
    let proxy = HeldProxy::in_front_of(&kubeconfig).await?;
    let [metrics_addr, probe_addr] = free_local_addrs()?;
    let _applier = applier_as_pod(proxy.kubeconfig(), &metrics_addr, &probe_addr).await?;

    let audit = AuditLog::from_now()?;
    proxy.hold();
    let mut scrapes = tokio::task::JoinSet::new();
    for i in 0..SCRAPES {
        let (addr, token) = (metrics_addr.clone(), unique_name(&format!("random{i}")));
        scrapes.spawn(async move {
            let out = tokio::process::Command::new("curl")
                .args(["-sS", "-k", "--max-time", "60", "-o", "/dev/null"])
                .args(["-w", "%{http_code}", "-H"])
                .arg(format!("Authorization: Bearer {token}"))
                .arg(format!("https://{addr}/metrics"))
                .stdin(Stdio::null())
                .output()
                .await;
            out.map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        });
    }
    // Those beyond the cap are answered while the reviews are held.
    let mut early = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while early.len() < SCRAPES - REVIEWS_AT_A_TIME {
        match tokio::time::timeout_at(deadline, scrapes.join_next()).await {
            Ok(Some(answer)) => early.push(answer??),
            Ok(None) => break,
            Err(_) => bail!(
                "while the API server held the reviews, {} of {SCRAPES} scrapes were answered \
                 ({early:?}): more than {REVIEWS_AT_A_TIME} reviews were asked at once",
                early.len()
            ),
        }
    }
    assert_eq!(
        early,
        vec!["503"; SCRAPES - REVIEWS_AT_A_TIME],
        "the scrapes answered while {REVIEWS_AT_A_TIME} reviews were in flight"
    );
    proxy.release();
    let mut late = Vec::new();
    while let Some(answer) = scrapes.join_next().await {
        late.push(answer??);
    }
    assert_eq!(late, vec!["401"; REVIEWS_AT_A_TIME], "the reviewed scrapes");
    let reviews = audit.events(|e| {
        e["objectRef"]["resource"] == "tokenreviews"
            && e["impersonatedUser"]["extra"]["pod"][0] == pod.as_str()
    })?;
    assert_eq!(reviews.len(), REVIEWS_AT_A_TIME, "TokenReviews asked");
    Ok(())
}

/// Hole 7: `/readyz` asks the API server (`/version`) at most once a second, however often
/// it is called: probes back to back for 4 s cost one ask per second they took, plus one at
/// most (and at least two: the answer is kept for a second, not for ever).
#[tokio::test]
async fn hole7_readyz_asks_the_api_server_at_most_once_a_second() -> Result<()> {
    const SPAN: Duration = Duration::from_secs(4);
    let pod = unique_name("readyz");
    let kubeconfig = kubeconfig_of_pod(&pod)?;
    let [metrics_addr, probe_addr] = free_local_addrs()?;
    let _applier = applier_as_pod(&kubeconfig, &metrics_addr, &probe_addr).await?;

    let audit = AuditLog::from_now()?;
    let (started, mut probes) = (Instant::now(), 0);
    while started.elapsed() < SPAN {
        assert_eq!(plain_get(&probe_addr, "/readyz").await?.0, 200);
        probes += 1;
    }
    let took = started.elapsed();
    let asks = audit
        .events(|e| {
            e["requestURI"] == "/version"
                && e["impersonatedUser"]["extra"]["pod"][0] == pod.as_str()
        })?
        .len();
    let most = took.as_secs() as usize + 1;
    println!("{probes} probes in {took:?}: {asks} asks of the API server (at most {most})");
    assert!(
        (2..=most).contains(&asks),
        "{probes} probes in {took:?} asked the API server {asks} times (2 to {most})"
    );
    Ok(())
}

/// Hole 7: clients that open the metrics port and never say hello hold 32 handshakes at
/// most; the next connection is closed at once (not after the handshake timeout), a scrape
/// then fails, and one slot freed lets a scrape through again.
#[tokio::test]
async fn hole7_the_metrics_port_handshakes_with_32_clients_at_most() -> Result<()> {
    use std::io::Read as _;
    let pod = unique_name("handshakes");
    let kubeconfig = kubeconfig_of_pod(&pod)?;
    let [metrics_addr, probe_addr] = free_local_addrs()?;
    let _applier = applier_as_pod(&kubeconfig, &metrics_addr, &probe_addr).await?;

    // Plain blocking sockets: a non-blocking read of one is a real read, so "still open"
    // below is what the kernel says, not a cached readiness.
    let mut silent = Vec::new();
    for _ in 0..HANDSHAKES_AT_A_TIME {
        silent.push(std::net::TcpStream::connect(&metrics_addr)?);
    }
    // Accepted after them (in order), the next one finds no slot: closed while all of them
    // are still open, so long before any handshake could time out.
    let mut extra = std::net::TcpStream::connect(&metrics_addr)?;
    extra.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut byte = [0u8; 1];
    let read = extra.read(&mut byte);
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock),
        "the connection beyond {HANDSHAKES_AT_A_TIME} handshakes was kept: {read:?}"
    );
    for (i, stream) in silent.iter_mut().enumerate() {
        stream.set_nonblocking(true)?;
        let read = stream.read(&mut byte);
        assert!(
            read.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
            "silent connection {i} was not open and waiting when the one beyond the cap was closed: {read:?}"
        );
    }
    let held = tokio::task::spawn_blocking({
        let addr = metrics_addr.clone();
        move || scrape(&addr, Trust::Anything, None)
    })
    .await??;
    assert!(
        held.is_err(),
        "a scrape got through 32 held handshakes: {held:?}"
    );

    // One silent client goes: its slot is freed when the applier sees it close.
    drop(silent.pop());
    let freed = Instant::now() + Duration::from_secs(20);
    loop {
        let addr = metrics_addr.clone();
        match tokio::task::spawn_blocking(move || scrape(&addr, Trust::Anything, None)).await?? {
            Ok((status, _)) => {
                assert_eq!(status, 401, "a scrape without a token");
                break;
            }
            Err(code) => assert!(
                Instant::now() < freed,
                "no scrape got through after a slot was freed (curl exit {code})"
            ),
        }
    }
    Ok(())
}
