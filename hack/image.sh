#!/usr/bin/env bash
# Builds the image of both binaries (Dockerfile) with the container builder this machine has,
# optionally pushes it, and sets it for both install paths:
#
#   hack/image.sh [--push] [--set] [--no-build] IMAGE
#
#   IMAGE        the reference to build, e.g. registry.example.com/capt/status-management:v0.2.0
#   --push       push it once built (a registry the cluster's nodes can pull from)
#   --set        name it in manifests/kustomization.yaml's `images:` (what `kubectl apply -k
#                manifests/` deploys) and build the clusterctl repository with it
#                (CAPT_IMAGE=IMAGE hack/clusterctl-repo.sh; its output path is printed)
#   --no-build   only --set (an image built elsewhere, by CI say)
#
# The builder: CAPT_IMAGE_BUILDER if set, else the first of docker, podman, buildah, nerdctl
# on the PATH. The Dockerfile uses a BuildKit cache mount, which all four support (docker
# through BuildKit, its default since 23.0).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
usage() { sed -n '2,17s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

push=false set=false build=true image=
while (($#)); do
	case $1 in
	--push) push=true ;;
	--set) set=true ;;
	--no-build) build=false ;;
	-h | --help) usage; exit 0 ;;
	-*) say "error: unknown option $1"; usage >&2; exit 2 ;;
	*) [[ -z "$image" ]] || { say "error: one IMAGE only (got $image and $1)"; exit 2; }; image=$1 ;;
	esac
	shift
done
[[ -n "$image" ]] || { say "error: name the image to build, e.g. hack/image.sh registry.example.com/capt/status-management:v0.2.0"; exit 2; }
# name[:tag][@digest], the name lowercase: what kustomize's `images:` and the kubelet accept.
[[ "$image" =~ ^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$ ]] ||
	{ say "error: $image is not an image reference (registry/name:tag, lowercase name)"; exit 2; }
$build || $set || { say "error: --no-build without --set does nothing"; exit 2; }

if $build; then
	# A builder is usable when it answers `info` (docker's and nerdctl's need their daemon).
	builder= tried=()
	for candidate in ${CAPT_IMAGE_BUILDER:-docker podman buildah nerdctl}; do
		command -v "$candidate" >/dev/null || continue
		if "$candidate" info >/dev/null 2>&1; then
			builder=$candidate
			break
		fi
		tried+=("$candidate (installed, but \`$candidate info\` fails: is its daemon running?)")
	done
	if [[ -z "$builder" ]]; then
		say "error: no usable container builder on this machine${tried[*]:+: ${tried[*]}}; install docker, podman, buildah or nerdctl (or name one in CAPT_IMAGE_BUILDER), or build the Dockerfile elsewhere and run hack/image.sh --no-build --set $image"
		exit 3
	fi
	[[ "$image" != *@* ]] || { say "error: a build is tagged, not named by digest: $image"; exit 2; }
	case $builder in
	buildah) build_cmd=(buildah build) ;;
	# docker's legacy builder lacks the Dockerfile's cache mount: BuildKit, or a clear error.
	docker) build_cmd=(env DOCKER_BUILDKIT=1 docker build) ;;
	*) build_cmd=("$builder" build) ;;
	esac
	say "building $image with $builder (Dockerfile: both binaries, release build, on distroless)"
	"${build_cmd[@]}" -t "$image" -f "$ROOT/Dockerfile" "$ROOT" >&2
	if $push; then
		say "pushing $image"
		"$builder" push "$image" >&2
	fi
fi

if $set; then
	# The tag or digest, and the name without it (a registry's port is not a tag).
	name=$image tag= digest=
	[[ "$name" == *@* ]] && { digest=${name#*@}; name=${name%%@*}; }
	[[ "${name##*/}" == *:* ]] && { tag=${name##*:}; name=${name%:*}; }
	python3 - "$ROOT/manifests/kustomization.yaml" "$name" "$tag" "$digest" <<'EOF'
import re, sys
path, name, tag, digest = sys.argv[1:]
text = open(path).read()
entry = "  - name: capt/status-management\n    newName: " + name + "\n"
entry += ("    digest: " + digest + "\n") if digest else ("    newTag: " + (tag or "latest") + "\n")
block = re.compile(r"^  - name: capt/status-management\n(    .*\n)*", re.M)
if not block.search(text):
    sys.exit(f"error: {path} has no `images:` entry for capt/status-management to set")
open(path, "w").write(block.sub(entry, text, count=1))
EOF
	say "manifests/kustomization.yaml now deploys $image (kubectl apply --server-side -k manifests/)"
	out=$(CAPT_IMAGE=$image "$ROOT/hack/clusterctl-repo.sh")
	say "the clusterctl repository names $image: clusterctl init --infrastructure capt --control-plane capt --config $out"
fi
