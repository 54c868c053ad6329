#!/usr/bin/env bash
# Build the container images the chart and the operator use, with docker or podman.
#
#   images/build.sh           build both images (tags: DEFAULT_*_IMAGE in operator/spillway/k8s_names.py)
#   images/build.sh --print   print the build commands without running them (needs no engine)
#
# CONTAINER_ENGINE=docker|podman picks the engine; otherwise the first of docker, podman whose
# engine answers is used. The build context holds only connector/, operator/ and images/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

print_only=0
case "${1:-}" in
  --print) print_only=1 ;;
  "") ;;
  *) echo "usage: images/build.sh [--print]" >&2; exit 2 ;;
esac

# Image names come from the one place that names them.
if ! names="$(python3 -c '
import runpy
names = runpy.run_path("operator/spillway/k8s_names.py")
print(names["DEFAULT_VLLM_IMAGE"], names["DEFAULT_OPERATOR_IMAGE"])')"; then
  echo "images: could not read the image names from operator/spillway/k8s_names.py with python3" >&2
  exit 1
fi
read -r vllm_image operator_image <<<"$names"

pick_engine() {
  local candidates=(docker podman) installed=() engine
  [ -n "${CONTAINER_ENGINE:-}" ] && candidates=("$CONTAINER_ENGINE")
  for engine in "${candidates[@]}"; do
    command -v "$engine" >/dev/null 2>&1 || continue
    installed+=("$engine")
    if "$engine" info >/dev/null 2>&1; then
      echo "$engine"
      return 0
    fi
  done
  if [ "${#installed[@]}" -eq 0 ]; then
    if [ -n "${CONTAINER_ENGINE:-}" ]; then
      echo "images: CONTAINER_ENGINE=$CONTAINER_ENGINE is not installed" >&2
    else
      echo "images: neither docker nor podman is installed; install one of them to build the images" >&2
    fi
  else
    echo "images: ${installed[*]} is installed but no container engine is reachable" \
         "(\`${installed[0]} info\` failed); start the engine (e.g. the docker daemon) and retry" >&2
  fi
  return 1
}

if [ "$print_only" = 1 ]; then
  engine="${CONTAINER_ENGINE:-docker}"
else
  engine="$(pick_engine)" || exit 1
fi

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
tar -cf - --exclude='__pycache__' --exclude='*.egg-info' --exclude='build' --exclude='dist' \
  connector operator images | tar -xf - -C "$context"

build() {  # build DOCKERFILE TAG
  local cmd=("$engine" build --file "$context/$1" --tag "$2" "$context")
  if [ "$print_only" = 1 ]; then
    echo "${cmd[*]/$context/<context>}"
  else
    echo "images: building $2 with $engine"
    "${cmd[@]}"
  fi
}

build images/vllm/Dockerfile "$vllm_image"
build images/operator/Dockerfile "$operator_image"
[ "$print_only" = 1 ] || echo "images: built $vllm_image and $operator_image"
