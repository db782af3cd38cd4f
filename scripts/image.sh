#!/usr/bin/env bash
# `make image`: build the container image from Containerfile and tag it
# ghcr.io/otel-guard/otel-guard:<version> (the Helm chart's default repository; the version
# comes from guard/_version.py).
#
# The engine: docker when a daemon answers (`docker info`), else buildah with chroot isolation
# (no daemon, works as root inside a plain container) and its default storage driver (overlay
# where the kernel allows it, else vfs; STORAGE_DRIVER=vfs forces vfs).
#
# The bases (IMAGE_BASE):
#   official  python:3.11-bookworm / python:3.11-slim-bookworm, pulled from the registry
#   local     Debian bookworm bases made here with mmdebstrap and imported into buildah as
#             localhost/otel-guard-build:bookworm and localhost/otel-guard-base:bookworm; made
#             once and reused (IMAGE_REBASE=1 makes them again, e.g. for security updates)
# Default: official with docker, local with buildah (no registry needed, only a Debian mirror
# and PyPI).
#
# Environment: IMAGE (the tag), IMAGE_ENGINE (docker|buildah), IMAGE_BASE (official|local),
# IMAGE_REBASE=1, DEBIAN_MIRROR (default http://deb.debian.org), STORAGE_DRIVER (buildah's),
# IMAGE_CA_CERTS (a PEM file the build's PyPI downloads trust; default: the
# host's /usr/local/share/ca-certificates). Prints the size and the build time, then one JSON
# line.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' guard/_version.py)
[[ -n "${VERSION}" ]] || { echo "image: no __version__ in guard/_version.py" >&2; exit 1; }
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE=${IMAGE:-ghcr.io/otel-guard/otel-guard:${VERSION}}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org}
SUITE=bookworm
BASE_TAG=localhost/otel-guard-base:${SUITE}
BUILD_TAG=localhost/otel-guard-build:${SUITE}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
buildah() { command buildah ${STORAGE_DRIVER:+--storage-driver "${STORAGE_DRIVER}"} "$@"; }

engine=${IMAGE_ENGINE:-}
if [[ -z "${engine}" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
  elif type -P buildah >/dev/null; then
    engine=buildah
  else
    echo "image: neither a docker daemon (docker info) nor buildah is available" >&2
    exit 1
  fi
fi
case "${engine}" in docker | buildah) ;; *) echo "image: IMAGE_ENGINE=${engine}?" >&2; exit 1 ;; esac
base=${IMAGE_BASE:-$([[ "${engine}" == docker ]] && echo official || echo local)}
case "${base}" in official | local) ;; *) echo "image: IMAGE_BASE=${base}?" >&2; exit 1 ;; esac
if [[ "${base}" == local && "${engine}" != buildah ]]; then
  echo "image: IMAGE_BASE=local needs buildah (the bases are imported into its storage)" >&2
  exit 1
fi

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# One Debian root file system as a local image: mmdebstrap, then imported from scratch.
make_base() {
  local tag=$1 packages=$2 work ctr
  if [[ -z "${IMAGE_REBASE:-}" ]] && buildah inspect --type image "${tag}" >/dev/null 2>&1; then
    echo "image: base ${tag} (cached)"
    return
  fi
  command -v mmdebstrap >/dev/null || { echo "image: local bases need mmdebstrap" >&2; exit 1; }
  echo "image: making base ${tag} (${packages}) with mmdebstrap"
  work=$(mktemp -d /var/tmp/otel-guard-base.XXXXXX)
  # No documentation, man pages or translations (licences stay); no Recommends; merged /usr
  # from the hook rather than the usrmerge package (which would pull in perl); no /dev (the
  # runtime provides it).
  mmdebstrap --quiet --variant=minbase --include="${packages}" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --skip=output/dev \
    "${SUITE}" "${work}/rootfs.tar" \
    "deb ${MIRROR}/debian ${SUITE} main" \
    "deb ${MIRROR}/debian ${SUITE}-updates main" \
    "deb ${MIRROR}/debian-security ${SUITE}-security main"
  ctr=$(buildah from scratch)
  buildah add --quiet "${ctr}" "${work}/rootfs.tar" / >/dev/null  # a local tar is unpacked
  buildah config \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --cmd /bin/sh \
    --label "org.opencontainers.image.description=Debian ${SUITE} minbase with ${packages}" \
    "${ctr}"
  buildah commit --quiet --rm "${ctr}" "${tag}" >/dev/null
  rm -rf "${work}"
}

started=$(now)
base_s=0
args=(--build-arg "VERSION=${VERSION}" --build-arg "REVISION=${REVISION}")
# The build stage downloads from PyPI: behind a TLS-intercepting proxy it must trust the
# proxy's CA. IMAGE_CA_CERTS names a PEM file; by default the host's local CAs are passed.
ca_files=()
if [[ -n "${IMAGE_CA_CERTS:-}" ]]; then
  ca_files=("${IMAGE_CA_CERTS}")
else
  shopt -s nullglob
  ca_files=(/usr/local/share/ca-certificates/*.crt /usr/local/share/ca-certificates/*/*.crt)
  shopt -u nullglob
fi
if ((${#ca_files[@]})); then
  echo "image: the build trusts the extra CA certificates ${ca_files[*]}"
  args+=(--build-arg "BUILD_CA_CERTS=$(cat "${ca_files[@]}")")
fi
if [[ "${base}" == local ]]; then
  base_started=$(now)
  make_base "${BASE_TAG}" python3,ca-certificates
  make_base "${BUILD_TAG}" python3,python3-venv,python3-dev,gcc,libc6-dev,ca-certificates
  base_s=$(since "${base_started}")
  args+=(--build-arg "BASE_IMAGE=${BASE_TAG}" --build-arg "BUILD_IMAGE=${BUILD_TAG}")
fi

echo "image: building ${IMAGE} with ${engine} (bases: ${base})"
build_started=$(now)
if [[ "${engine}" == docker ]]; then
  docker build -f Containerfile -t "${IMAGE}" "${args[@]}" .
  size_bytes=$(docker image inspect -f '{{.Size}}' "${IMAGE}")
else
  # --format docker: the OCI format has no HEALTHCHECK, and buildah would drop it. --layers:
  # a rebuild reuses every step whose inputs did not change (the dependency install above all);
  # --force-rm: a failed build leaves no working container behind.
  buildah bud --format docker --layers --force-rm --isolation "${BUILDAH_ISOLATION}" \
    -f Containerfile -t "${IMAGE}" "${args[@]}" .
  # the image's size: its layers, uncompressed (what `buildah images` shows, in bytes)
  size_bytes=$(buildah inspect --type image "${IMAGE}" | python3 -c \
    'import json, sys; m = json.loads(json.load(sys.stdin)["Manifest"]); print(sum(x["size"] for x in m["layers"]))')
fi
build_s=$(since "${build_started}")
total_s=$(since "${started}")
size_mb=$(awk -v b="${size_bytes}" 'BEGIN { printf "%.1f", b / 1e6 }')
echo "image: ${IMAGE}: ${size_mb} MB, built in ${build_s} s (bases ${base_s} s, total ${total_s} s)"
printf '{"image": "%s", "engine": "%s", "base": "%s", "size_mb": %s, "build_s": %s, "base_s": %s, "total_s": %s}\n' \
  "${IMAGE}" "${engine}" "${base}" "${size_mb}" "${build_s}" "${base_s}" "${total_s}"
