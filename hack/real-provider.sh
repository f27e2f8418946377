# Sourced by hack/testenv.sh (uses its ROOT, STATE, CACHE, log, die, build_one, is_running):
# the real Crossplane provider-terraform and OpenTofu, pinned by hack/tools/provider-terraform,
# built from the Go module proxy, and run out of cluster against the test environment.
#
# The provider serves metrics on :8080 (no flag moves it), so one runs per machine at a time:
# `provider-start` takes a machine-wide lock (flock on $PROVIDER_LOCK) that the provider process
# inherits and holds until it exits; a second environment waits for it (at most
# CAPT_PROVIDER_LOCK_WAIT seconds, default 900), never starts a second one.
# Kept apart from testenv.sh so that the two files change independently.

PROVIDER_TOOLS="$ROOT/hack/tools/provider-terraform"
PROVIDER_LOCK=${CAPT_PROVIDER_LOCK:-/tmp/capt-real-provider.lock}
# The ProviderConfig every Workspace names by default (the Workspace CRD's default).
PROVIDER_CONFIG=default
# Where the backend's state Secrets and Leases and the backend's credentials live.
PROVIDER_NAMESPACE=crossplane-system

provider_bin_dir() {
	local key
	key=$(cat "$PROVIDER_TOOLS/go.mod" "$PROVIDER_TOOLS/go.sum" <(go env GOVERSION) | sha256sum | cut -c1-16)
	echo "$CACHE/provider-terraform-$key"
}

# The module's source in the Go module cache, verified against hack/tools/provider-terraform/go.sum.
provider_module_dir() {
	(cd "$PROVIDER_TOOLS" && go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
}

provider_module_version() {
	grep -oE "$1 v[^ ]+" "$PROVIDER_TOOLS/go.mod" | head -n 1 | cut -d' ' -f2
}

# Builds module $1's package $2 into $3 from a writable copy of the module (the module cache
# is read-only, and OpenTofu's go.mod has a replace, which `go install` refuses).
build_from_copy() {
	local module=$1 pkg=$2 out=$3 ldflags=$4 src copy
	src=$(provider_module_dir "$module")
	[[ -f "$src/go.mod" ]] || die "$module not found in the module cache"
	copy="$(dirname "$out")/src-$(basename "$out")"
	rm -rf "$copy"
	cp -r "$src" "$copy"
	chmod -R u+w "$copy"
	build_one "$copy" "$pkg" "$out" "$ldflags"
	rm -rf "$copy"
}

build_provider() {
	local bin tmp started
	bin=$(provider_bin_dir)
	[[ -x "$bin/provider" && -x "$bin/tofu" && -x "$bin/terraform" ]] && return
	log "cold build into $bin (provider-terraform $(provider_module_version github.com/upbound/provider-terraform), OpenTofu $(provider_module_version github.com/opentofu/opentofu); progress every 20 s)"
	tmp="$bin.partial"
	mkdir -p "$tmp"
	started=$(date +%s)
	[[ -x "$tmp/provider" ]] || build_from_copy github.com/upbound/provider-terraform ./cmd/provider "$tmp/provider" "-s -w"
	# version.dev=no: a release build (a dev build prints a warning on every command).
	[[ -x "$tmp/tofu" ]] || build_from_copy github.com/opentofu/opentofu ./cmd/tofu "$tmp/tofu" \
		"-s -w -X github.com/opentofu/opentofu/version.dev=no"
	# The provider runs `terraform` from PATH: this directory comes first on its PATH, so it
	# runs this tofu, never a terraform installed on the machine.
	cat >"$tmp/terraform" <<'EOF'
#!/bin/sh
exec "$(dirname "$0")/tofu" "$@"
EOF
	chmod +x "$tmp/terraform"
	rm -f "$tmp"/*.build.log
	mv "$tmp" "$bin"
	log "provider-terraform and OpenTofu built in $(($(date +%s) - started)) s"
}

# The ProviderConfig and ProviderConfigUsage CRDs (the Workspace's is installed with the rest).
provider_crds() {
	local dir
	dir=$(provider_module_dir github.com/upbound/provider-terraform)
	echo "$dir/package/crds/tf.upbound.io_providerconfigs.yaml"
	echo "$dir/package/crds/tf.upbound.io_providerconfigusages.yaml"
}

# The CRDs, the backend's namespace, its credentials and the ProviderConfig `default` with the
# kubernetes backend: the state of each Workspace in a Secret `tfstate-<workspace>-capt`, its
# lock in a Lease (with the default local backend, Workspaces stick at `observe failed: cannot
# list Terraform resources`). The backend reaches the API server with the kubeconfig of the
# Secret `real-provider-backend`, which the provider writes into each Workspace's directory.
install_provider_config() {
	local args=() f
	for f in $(provider_crds); do args+=(-f "$f"); done
	kubectl apply --server-side --field-manager testenv "${args[@]}" >/dev/null
	kubectl wait --for condition=Established --timeout 60s crd providerconfigs.tf.upbound.io providerconfigusages.tf.upbound.io >/dev/null
	kubectl create namespace "$PROVIDER_NAMESPACE" --dry-run=client -o yaml | kubectl apply --server-side --field-manager testenv -f - >/dev/null
	kubectl -n "$PROVIDER_NAMESPACE" create secret generic real-provider-backend \
		--from-file=kubeconfig="$STATE/kubeconfig" --dry-run=client -o yaml |
		kubectl apply --server-side --field-manager testenv -f - >/dev/null
	kubectl apply --server-side --field-manager testenv -f - >/dev/null <<EOF
apiVersion: tf.upbound.io/v1beta1
kind: ProviderConfig
metadata:
  name: $PROVIDER_CONFIG
spec:
  credentials:
  - filename: backend-kubeconfig
    source: Secret
    secretRef: {namespace: $PROVIDER_NAMESPACE, name: real-provider-backend, key: kubeconfig}
  configuration: |
    terraform {
      backend "kubernetes" {
        secret_suffix = "capt"
        namespace     = "$PROVIDER_NAMESPACE"
        config_path   = "backend-kubeconfig"
      }
    }
EOF
	log "installed the ProviderConfig and ProviderConfigUsage CRDs and ProviderConfig $PROVIDER_CONFIG (kubernetes backend in $PROVIDER_NAMESPACE)"
}

# Starts the real provider against the running environment, unless it runs already.
cmd_provider_start() {
	is_running kube-apiserver || die "not running (hack/testenv.sh start)"
	if is_running provider-terraform; then
		log "the real provider runs already"
		return
	fi
	local bin started
	build_provider
	bin=$(provider_bin_dir)
	export KUBECONFIG="$STATE/kubeconfig" PATH="$(cat "$STATE/bin-dir"):$PATH"
	install_provider_config
	mkdir -p "$STATE/provider-terraform/tf"
	# fd 9 holds the machine-wide lock; the provider inherits it, so the lock lives as long as
	# the provider does, whoever started it.
	exec 9>>"$PROVIDER_LOCK"
	if ! flock -n 9; then
		log "another real provider runs on this machine ($(cat "$PROVIDER_LOCK.owner" 2>/dev/null || echo unknown)); waiting for it to stop (at most ${CAPT_PROVIDER_LOCK_WAIT:-900} s)"
		flock -w "${CAPT_PROVIDER_LOCK_WAIT:-900}" 9 || die "the real provider of $(cat "$PROVIDER_LOCK.owner" 2>/dev/null) still runs"
	fi
	echo "$STATE" >"$PROVIDER_LOCK.owner"
	started=$(date +%s.%N)
	# Its own session, so that `provider-stop` ends it and the tofu processes it runs together.
	XP_TF_DIR="$STATE/provider-terraform/tf" PATH="$bin:$PATH" \
		setsid "$bin/provider" --debug --poll=15s --poll-jitter=1s \
		>"$STATE/provider-terraform.log" 2>&1 &
	echo $! >"$STATE/provider-terraform.pid"
	exec 9>&-
	local i
	for ((i = 0; i < 600; i++)); do
		is_running provider-terraform || {
			tail -n 20 "$STATE/provider-terraform.log" >&2
			die "the real provider exited; see $STATE/provider-terraform.log"
		}
		grep -q '"Starting workers".*"controller": *"managed/workspace.tf.upbound.io"\|Starting workers.*managed/workspace' "$STATE/provider-terraform.log" && break
		sleep 0.2
	done
	((i < 600)) || die "the real provider did not start its Workspace controller; see $STATE/provider-terraform.log"
	log "real provider-terraform running (pid $(cat "$STATE/provider-terraform.pid"), $(tofu_version "$bin"), log $STATE/provider-terraform.log) in $(printf '%.1f' "$(echo "$(date +%s.%N) - $started" | bc)") s"
}

# CAPT_TESTENV_REAL_PROVIDER=1 while the real provider runs (tests start no fake one then).
print_provider_env() {
	if is_running provider-terraform; then
		echo "export CAPT_TESTENV_REAL_PROVIDER=1"
	else
		echo "export CAPT_TESTENV_REAL_PROVIDER=0"
	fi
}

tofu_version() { "$1/terraform" version 2>/dev/null | head -n 1; }

cmd_provider_stop() {
	[[ -f "$STATE/provider-terraform.pid" ]] || return 0
	local pid i
	pid=$(cat "$STATE/provider-terraform.pid")
	if kill -0 "$pid" 2>/dev/null; then
		kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
		for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 -- "-$pid" 2>/dev/null || true
	fi
	rm -f "$STATE/provider-terraform.pid"
	log "real provider stopped"
}
