#!/usr/bin/env bash
# Builds a local clusterctl provider repository of CAPT from manifests/ (the clusterctl
# provider contract's layout), and a clusterctl config that points at it:
#
#   OUT/infrastructure-capt/VERSION/{infrastructure-components.yaml,metadata.yaml,cluster-template.yaml}
#   OUT/control-plane-capt/VERSION/{control-plane-components.yaml,metadata.yaml}
#   OUT/clusterctl.yaml
#
#   hack/clusterctl-repo.sh [OUT [VERSION]]    (default: .clusterctl-repo, v<the workspace version>)
#   clusterctl generate provider --infrastructure capt --config OUT/clusterctl.yaml
#
# clusterctl substitutes `${VAR}` (envsubst) in everything it reads. The only variables of
# the components are CAPT's own, all named CAPT_*; every other `${` (the CRDs document
# `${key}` substitution of WorkspaceTemplates) is escaped as `$${`, which clusterctl turns
# back into `${`. A variable's env value is quoted, so that `900` stays a string.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$ROOT/.clusterctl-repo}
# The release version: the workspace's (Cargo.toml [workspace.package]), CHANGELOG.md's head.
VERSION=${2:-v$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)}
[[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] || { echo "error: VERSION must be a semantic version like v0.1.0, got $VERSION" >&2; exit 2; }
command -v kubectl >/dev/null || { echo "error: kubectl is needed (hack/testenv.sh build provides one)" >&2; exit 2; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The image is the release's, canonical as clusterctl requires (override it with the
# clusterctl config's `images:`).
IMAGE=${CAPT_IMAGE:-docker.io/capt/status-management:$VERSION}
components() { # kustomization dir, output file
	kubectl kustomize --load-restrictor LoadRestrictionsNone "$ROOT/manifests/clusterctl/$1" |
		sed -e 's/\${/$${/g' -e 's/\$\${CAPT_/${CAPT_/g' \
			-e 's/^\( *value: \)\(\${CAPT_[^"]*}\)$/\1"\2"/' \
			-e "s|image: capt/status-management:dev|image: $IMAGE|" >"$2"
}

infra=$OUT/infrastructure-capt/$VERSION
cp_dir=$OUT/control-plane-capt/$VERSION
mkdir -p "$infra" "$cp_dir"
components infrastructure "$infra/infrastructure-components.yaml"
components control-plane "$cp_dir/control-plane-components.yaml"
cp "$ROOT/manifests/clusterctl/metadata.yaml" "$infra/metadata.yaml"
cp "$ROOT/manifests/clusterctl/metadata.yaml" "$cp_dir/metadata.yaml"
cp "$ROOT/manifests/clusterctl/templates/cluster-template.yaml" "$infra/cluster-template.yaml"
cat >"$OUT/clusterctl.yaml" <<CONFIG
# clusterctl config for the local repository of CAPT $VERSION (hack/clusterctl-repo.sh).
providers:
  - name: capt
    type: InfrastructureProvider
    url: file://$infra/infrastructure-components.yaml
  - name: capt
    type: ControlPlaneProvider
    url: file://$cp_dir/control-plane-components.yaml
CONFIG
echo "$OUT/clusterctl.yaml"
