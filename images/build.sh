#!/usr/bin/env bash
# Build the container images the chart and the operator use, with docker, podman or buildah.
#
#   images/build.sh [IMAGE...]          build these (default: all three)
#   images/build.sh --print [IMAGE...]  print the build commands without running them (needs no engine)
#
# IMAGE: operator, vllm (GPU, FROM vllm/vllm-openai), vllm-cpu (the same Dockerfile on the CPU build of
# vLLM, images/vllm/cpu/Dockerfile). Tags: DEFAULT_*_IMAGE in operator/spillway/core/k8s_names.py; the CPU
# image is tagged like the GPU one with its own vLLM release and "-cpu".
#
# CONTAINER_ENGINE=docker|podman|buildah picks the engine; otherwise the first of docker, podman, buildah
# whose engine answers is used. The build context holds only connector/, operator/ and images/.
#
# Base images come from the engine's store, else from their registry. Where none can be reached, the
# Python base is made locally (debootstrap of Debian's bookworm, tagged as the upstream image; kept and
# reused while its recipe below is unchanged). It is Debian's Python 3.11.2, not 3.11.14: it checks the
# Dockerfiles' logic and wheel sets, not the exact base. vLLM's GPU image cannot be made so: without
# it `vllm` is skipped when not asked for by name, and fails when it is.
#
# With podman or buildah, RUN steps reach the network through the host's (--network host) and trust its
# CA bundle (bind-mounted for RUN steps only, nothing lands in the image). PIP_FIND_LINKS (else pip's
# global.find-links), when it names a local directory, is mounted at /wheels for the CPU build and
# replaces PyTorch's CPU index there (machines where PyTorch's CPU wheel lies on disk).
#
# Each build ends with the image's facts: size, layers, user, whether it runs with a read-only root
# filesystem, no capabilities and no privilege escalation (podman and docker; buildah cannot run images),
# and its digest (podman, buildah).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

print_only=0
wanted=()
for arg in "$@"; do
  case "$arg" in
    --print) print_only=1 ;;
    operator|vllm|vllm-cpu) wanted+=("$arg") ;;
    *) echo "usage: images/build.sh [--print] [operator|vllm|vllm-cpu ...]" >&2; exit 2 ;;
  esac
done
explicit=$(( ${#wanted[@]} > 0 ))
[ "$explicit" = 1 ] || wanted=(operator vllm vllm-cpu)

# Image names come from the one place that names them.
k8s_names=operator/spillway/core/k8s_names.py
if ! names="$(python3 -c '
import runpy, sys
names = runpy.run_path(sys.argv[1])
print(names["DEFAULT_VLLM_IMAGE"], names["DEFAULT_OPERATOR_IMAGE"])' "$k8s_names")"; then
  echo "images: could not read the image names from $k8s_names with python3" >&2
  exit 1
fi
read -r vllm_image operator_image <<<"$names"
arg_default() {  # arg_default DOCKERFILE NAME: the default of `ARG NAME=...`
  sed -n "s/^ARG $2=//p" "$1" | head -n1
}
vllm_cpu_version="$(arg_default images/vllm/cpu/Dockerfile VLLM_CPU_VERSION)"
vllm_gpu_base="$(arg_default images/vllm/Dockerfile VLLM_BASE)"
vllm_cpu_image="${vllm_image%-vllm*}-vllm${vllm_cpu_version}-cpu"
vllm_cpu_base="localhost/spillway-vllm-cpu-base:${vllm_cpu_version}"
python_base="python:3.11.14-slim-bookworm"

pick_engine() {
  local candidates=(docker podman buildah) installed=() engine
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
      echo "images: neither docker, podman nor buildah is installed; install one of them to build the images" >&2
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

# -- engine verbs -------------------------------------------------------------------------------------
ca_bundle=/etc/ssl/certs/ca-certificates.crt
volumes=()  # more --volume mounts for RUN steps (podman, buildah)
build_command() {  # build_command DOCKERFILE TAG CONTEXT [BUILD-ARG...]
  local dockerfile=$1 tag=$2 context=$3 cmd
  shift 3
  case "$engine" in
    docker) cmd=(docker build) ;;
    podman) cmd=(podman build --layers --pull=never --network host) ;;
    buildah) cmd=(buildah bud --layers --pull=never --isolation chroot --network host) ;;
  esac
  if [ "$engine" != docker ] && [ -f "$ca_bundle" ]; then
    cmd+=(--volume "$ca_bundle:$ca_bundle:ro")
  fi
  local volume
  for volume in "${volumes[@]}"; do
    cmd+=(--volume "$volume")
  done
  local build_arg
  for build_arg in "$@"; do
    cmd+=(--build-arg "$build_arg")
  done
  cmd+=(--file "$context/$dockerfile" --tag "$tag" "$context")
  printf '%s\n' "${cmd[@]}"
}

have_image() {
  case "$engine" in
    docker) docker image inspect "$1" >/dev/null 2>&1 ;;
    podman) podman image exists "$1" ;;
    buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
  esac
}

image_label() {  # image_label IMAGE LABEL
  local format="{{ index .Config.Labels \"$2\" }}"
  case "$engine" in
    buildah) format="{{ index .OCIv1.Config.Labels \"$2\" }}"; buildah inspect --type image --format "$format" "$1" ;;
    *) "$engine" image inspect --format "$format" "$1" ;;
  esac 2>/dev/null || true
}

pull() {
  "$engine" pull --quiet "$1" >/dev/null 2>&1
}

# -- the Python base, made locally where no registry answers --------------------------------------------
# The recipe (what the stamp label keys on): the Debian packages and the steps that make it look like
# the official image to a Dockerfile (pip usable system-wide, python and pip on /usr/local/bin).
base_packages="python3,python3-pip,ca-certificates"
base_containerfile='FROM localhost/spillway-debootstrap:bookworm
RUN rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED \
    && ln -sf /usr/bin/python3 /usr/local/bin/python3 && ln -sf /usr/bin/python3 /usr/local/bin/python \
    && ln -sf /usr/bin/pip3 /usr/local/bin/pip3 && ln -sf /usr/bin/pip3 /usr/local/bin/pip
CMD ["python3"]'
recipe_label=dev.spillway.base-recipe
recipe="$(printf 'debootstrap --variant=minbase --include=%s bookworm\n%s\n' "$base_packages" "$base_containerfile" \
  | sha256sum | cut -c1-16)"

import_rootfs() {  # import_rootfs DIRECTORY TAG
  case "$engine" in
    docker) tar -C "$1" -c . | docker import - "$2" >/dev/null ;;
    podman) tar -C "$1" -c . | podman import --quiet - "$2" >/dev/null ;;
    buildah)  # `buildah add` unpacks a tar archive into the container's root
      local container archive
      container="$(buildah from scratch)"
      archive="$(mktemp --suffix .tar)"
      tar -C "$1" -cf "$archive" .
      buildah add "$container" "$archive" / >/dev/null
      rm -f "$archive"
      buildah commit --quiet "$container" "$2" >/dev/null
      buildah rm "$container" >/dev/null ;;
  esac
}

make_python_base() {
  local started=$SECONDS rootfs mirror context
  command -v debootstrap >/dev/null 2>&1 || {
    echo "images: $python_base is not in the $engine store and cannot be pulled; install debootstrap" \
         "(apt-get install debootstrap) to make it locally" >&2
    return 1
  }
  [ "$(id -u)" = 0 ] || { echo "images: making $python_base locally needs root (debootstrap)" >&2; return 1; }
  mirror="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  echo "images: $python_base cannot be pulled; making it locally (debootstrap bookworm from $mirror)"
  rootfs="$(mktemp -d)"
  context="$(mktemp -d)"
  if ! debootstrap --variant=minbase --include="$base_packages" bookworm "$rootfs" "$mirror" \
      >"$context/debootstrap.log" 2>&1; then
    tail -n 20 "$context/debootstrap.log" >&2
    rm -rf "$rootfs" "$context"
    echo "images: debootstrap failed" >&2
    return 1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  import_rootfs "$rootfs" localhost/spillway-debootstrap:bookworm
  rm -rf "$rootfs"
  printf '%s\nLABEL %s=%s\n' "$base_containerfile" "$recipe_label" "$recipe" >"$context/Containerfile"
  mapfile -t cmd < <(build_command Containerfile "docker.io/library/$python_base" "$context")
  "${cmd[@]}" >/dev/null
  rm -rf "$context"
  echo "images: made $python_base locally in $((SECONDS - started)) s"
}

ensure_base() {  # ensure_base IMAGE: present, pulled, or (the Python base) made locally
  local image=$1
  if have_image "$image"; then
    local label
    label="$(image_label "$image" "$recipe_label")"
    # An upstream image carries no recipe label; a local one made by an older recipe is made anew.
    if [ -z "$label" ] || [ "$label" = "$recipe" ]; then
      return 0
    fi
    echo "images: the local $image was made by another recipe; making it anew"
  elif pull "$image"; then
    return 0
  elif [ "$image" != "$python_base" ]; then
    return 1
  fi
  make_python_base
}

# -- facts ------------------------------------------------------------------------------------------------
facts() {  # facts IMAGE CHECK-ENTRYPOINT [CHECK-ARGS...]
  local image=$1 size layers user readonly
  shift
  case "$engine" in
    buildah)
      size="$(buildah images --format '{{.Size}}' "$image" | head -n1)"
      layers="$(buildah inspect --type image --format '{{len .OCIv1.RootFS.DiffIDs}}' "$image")"
      user="$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$image")"
      readonly="not checked (buildah runs no images; podman or docker does)" ;;
    *)
      size="$("$engine" image inspect --format '{{.Size}}' "$image")"
      size="$(awk -v b="$size" 'BEGIN { printf "%.0f MB", b / 1e6 }')"
      layers="$("$engine" image inspect --format '{{len .RootFS.Layers}}' "$image")"
      user="$("$engine" image inspect --format '{{.Config.User}}' "$image")"
      if "$engine" run --rm --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
           --network none --entrypoint "$1" "$image" "${@:2}" >/dev/null 2>&1; then
        readonly="yes ($* as user $user: read-only root, /tmp a tmpfs, no capabilities, no new privileges)"
      else
        readonly="NO: \`$*\` failed with a read-only root, no capabilities, no new privileges"
      fi ;;
  esac
  local digest=""
  case "$engine" in  # the digest to pin it by (docker knows one only once the image is pushed)
    podman) digest="$(podman image inspect --format '{{.Digest}}' "$image")" ;;
    buildah) digest="$(buildah images --format '{{.Digest}}' "$image" | head -n1)" ;;
  esac
  echo "images: $image: size $size, $layers layers, user ${user:-root}, read-only root: $readonly${digest:+, digest $digest}"
}

# -- builds -----------------------------------------------------------------------------------------------
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
tar -cf - --exclude='__pycache__' --exclude='*.egg-info' --exclude='build' --exclude='dist' \
  connector operator images | tar -xf - -C "$context"

build() {  # build DOCKERFILE TAG [BUILD-ARG...]
  local started=$SECONDS cmd
  mapfile -t cmd < <(build_command "$1" "$2" "$context" "${@:3}")
  if [ "$print_only" = 1 ]; then
    echo "${cmd[*]//$context/<context>}"
    return 0
  fi
  echo "images: building $2 with $engine"
  "${cmd[@]}"
  echo "images: built $2 in $((SECONDS - started)) s"
}

cpu_base_args=() cpu_base_volumes=()
find_links="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}"
if [ -n "$find_links" ] && [ -d "$find_links" ] && [ "$engine" != docker ]; then
  # The host's local wheels (PyTorch's CPU wheel among them) replace PyTorch's CPU index.
  cpu_base_args=(PIP_FIND_LINKS=/wheels TORCH_INDEX=)
  cpu_base_volumes=("$(readlink -f "$find_links"):/wheels:ro")
fi

built=()
for image in "${wanted[@]}"; do
  if [ "$print_only" = 0 ]; then
    case "$image" in
      operator|vllm-cpu) ensure_base "$python_base" || exit 1 ;;
      vllm)
        ensure_base "$python_base" || exit 1
        if ! ensure_base "$vllm_gpu_base"; then
          if [ "$explicit" = 1 ]; then
            echo "images: $vllm_gpu_base is not in the $engine store and cannot be pulled" >&2
            exit 1
          fi
          echo "images: skipped $vllm_image: its base $vllm_gpu_base is not in the $engine store and cannot" \
               "be pulled (the CPU image $vllm_cpu_image is the same Dockerfile on another base)"
          continue
        fi ;;
    esac
  fi
  case "$image" in
    operator)
      build images/operator/Dockerfile "$operator_image"
      [ "$print_only" = 1 ] || facts "$operator_image" spillway --help ;;
    vllm)
      build images/vllm/Dockerfile "$vllm_image"
      [ "$print_only" = 1 ] || facts "$vllm_image" python3 -c "import vllm, spillway_connector" ;;
    vllm-cpu)
      volumes=("${cpu_base_volumes[@]}")
      build images/vllm/cpu/Dockerfile "$vllm_cpu_base" "${cpu_base_args[@]}"
      volumes=()
      build images/vllm/Dockerfile "$vllm_cpu_image" "VLLM_BASE=$vllm_cpu_base"
      [ "$print_only" = 1 ] || facts "$vllm_cpu_image" python3 -c "import vllm, spillway_connector" ;;
  esac
  built+=("$image")
done
[ "$print_only" = 1 ] || echo "images: built ${built[*]:-nothing}"
