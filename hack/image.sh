#!/usr/bin/env bash
# Builds the image of Containerfile as an OCI archive without a container engine.
#
#   hack/image.sh            the static release binary, then target/image/hcp-fleet-agent.oci.tar
#   hack/image.sh binary     only the static binary (for buildah/podman/docker with Containerfile)
#   hack/image.sh name       only the image's name (hack/image-check.sh reads it here)
#
# The binary is linked statically against glibc (-C target-feature=+crt-static); since glibc
# 2.34 its DNS and files name lookups live in libc itself, so a scratch image resolves Service
# names. The image is assembled with umoci (Debian's package, installed with apt-get when
# missing) from Containerfile's FROM scratch / COPY / USER / ENTRYPOINT / LABEL lines; anything
# else in that file is refused rather than ignored. Its name is the chart's default image
# (values.yaml image.repository, Chart.yaml appVersion), so the chart installs what this builds.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[image] $*" >&2; }
die() { say "error: $*"; exit 1; }

repository="$(sed -n 's/^  repository: *//p' charts/hcp-fleet-agent/values.yaml | head -n 1)"
version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/hcp-fleet-agent/Chart.yaml)"
[ -n "$repository" ] && [ -n "$version" ] || die "cannot read the chart's image repository and appVersion"
[ "${1:-}" = name ] && { echo "$repository:$version"; exit 0; }

target=x86_64-unknown-linux-gnu
binary="target/$target/release/hcp-fleet-agent"
# --target keeps this build apart from the debug one (build scripts stay dynamic, host-built).
# Without the test bed (the `testbed` feature: etcd and kube-apiserver supervision, the
# stand-in kubelet, `dev`, `package`): none of it ships.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
  cargo build --release --locked --no-default-features --target "$target" --bin hcp-fleet-agent >&2
interp="$(readelf -l "$binary" 2>/dev/null | grep -c 'Requesting program interpreter' || true)"
[ "$interp" = 0 ] || die "$binary is dynamically linked"
say "static binary: $binary ($(du -h "$binary" | cut -f1))"
[ "${1:-}" = binary ] && exit 0

if ! command -v umoci >/dev/null 2>&1; then
  say "installing umoci with apt-get"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  { $sudo apt-get install -y -qq umoci || { $sudo apt-get update -qq && $sudo apt-get install -y -qq umoci; }; } >&2 \
    || die "cannot install umoci"
fi


work="target/image"
layout="$work/layout"
bundle="$work/bundle"
rm -rf "$layout" "$bundle"
mkdir -p "$work"
rootless=()
[ "$(id -u)" = 0 ] || rootless=(--rootless)
umoci init --layout "$layout"
umoci new --image "$layout:$version"
# unpack/repack, not `umoci insert`: umoci 0.4.7's insert leaves the layer's tar without its
# final padding and end blocks, which GNU tar (and Go's reader) take for a truncated file.
umoci unpack "${rootless[@]}" --image "$layout:$version" "$bundle" >/dev/null
rootfs="$bundle/rootfs"
config_args=()
while IFS= read -r line || [ -n "$line" ]; do
  line="${line%%#*}"
  [ -z "${line//[[:space:]]/}" ] && continue
  read -r instr rest <<<"$line"
  case "$instr" in
    FROM) [ "$rest" = scratch ] || die "Containerfile: only FROM scratch is understood, not '$rest'" ;;
    COPY)
      read -r src dst extra <<<"$rest"
      [ -z "${extra:-}" ] || die "Containerfile: COPY takes one source and one destination"
      [ -f "$src" ] || die "Containerfile: COPY source $src does not exist"
      mkdir -p "$rootfs$(dirname "$dst")"
      install -m 0755 "$src" "$rootfs$dst" ;;
    USER)
      [[ "$rest" =~ ^[0-9]+(:[0-9]+)?$ ]] || die "Containerfile: USER must be numeric, not '$rest'"
      config_args+=(--config.user="$rest") ;;
    ENTRYPOINT)
      # A JSON array of strings, one word each here.
      entry="$(echo "$rest" | sed -e 's/^\[//' -e 's/\]$//' -e 's/"//g' -e 's/, */ /g')"
      for word in $entry; do config_args+=(--config.entrypoint="$word"); done ;;
    LABEL)
      key="${rest%%=*}"; value="${rest#*=}"; value="${value#\"}"; value="${value%\"}"
      config_args+=(--config.label="$key=$value") ;;
    *) die "Containerfile: $instr is not understood by hack/image.sh" ;;
  esac
done <Containerfile
umoci repack "${rootless[@]}" --image "$layout:$version" "$bundle"
umoci config "${rootless[@]}" --image "$layout:$version" --os linux --architecture amd64 \
  --config.label "org.opencontainers.image.version=$version" "${config_args[@]}"
umoci gc --layout "$layout"
# The image's full name where docker, podman and skopeo read it from an OCI archive (umoci's
# tags cannot hold a registry path).
python3 - "$layout/index.json" "$repository:$version" <<'PY'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["org.opencontainers.image.ref.name"] = ref
json.dump(index, open(path, "w"))
PY
archive="$work/hcp-fleet-agent.oci.tar"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layout" -cf "$archive" .
say "$repository:$version -> $archive ($(du -h "$archive" | cut -f1))"
echo "$archive"
