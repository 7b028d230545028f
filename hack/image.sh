#!/usr/bin/env bash
# Builds the image of Containerfile as an OCI archive without a container engine.
#
#   hack/image.sh            the static release binary, then target/image/hcp-fleet-agent.oci.tar
#   hack/image.sh binary     only the static binary (for buildah/podman/docker with Containerfile)
#   hack/image.sh name       only the image's name (hack/image-check.sh reads it here)
#   hack/image.sh reproduce  the image, then the binary compiled again and the image written
#                            again: the two digests must be one (`make test` runs this)
#
# The binary is linked statically against glibc (-C target-feature=+crt-static); since glibc
# 2.34 its DNS and files name lookups live in libc itself, so a scratch image resolves Service
# names. Paths that would otherwise end up in it (cargo's registry, the checkout) are remapped,
# so where the clone and CARGO_HOME are does not change a byte. The image is written by
# hack/oci-image.py from Containerfile's FROM scratch / COPY / USER / ENTRYPOINT / LABEL lines
# (anything else is refused rather than ignored), every date SOURCE_DATE_EPOCH (the commit's
# time): one commit, one digest. Its name is the chart's default image (values.yaml
# image.repository, Chart.yaml appVersion), so the chart installs what this builds. Beside the
# archive: the digest (.digest) and the CycloneDX SBOMs of the binary and the image
# (hack/sbom.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "[image] $*" >&2; }
die() { say "error: $*"; exit 1; }

repository="$(sed -n 's/^  repository: *//p' charts/hcp-fleet-agent/values.yaml | head -n 1)"
version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/hcp-fleet-agent/Chart.yaml)"
[ -n "$repository" ] && [ -n "$version" ] || die "cannot read the chart's image repository and appVersion"
# IMAGE_VARIANT=fips: the FIPS variant (feature `fips`, AWS-LC's FIPS module), tagged
# <version>-fips, in target/image-fips, built in its own target directory (make image-fips).
case "${IMAGE_VARIANT:-}" in
  "") features=ring; tag="$version"; work="target/image" ;;
  fips) features=fips; tag="$version-fips"; work="target/image-fips"
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/fips}" ;;
  *) die "IMAGE_VARIANT must be empty or fips, not '$IMAGE_VARIANT'" ;;
esac
[ "${1:-}" = name ] && { echo "$repository:$tag"; exit 0; }

target=x86_64-unknown-linux-gnu
binary="${CARGO_TARGET_DIR:-target}/$target/release/hcp-fleet-agent"
# --target keeps this build apart from the debug one (build scripts stay dynamic, host-built).
# The cli crate's binary, whose dependency graph has no test bed (etcd and kube-apiserver
# supervision, the stand-in kubelet, `dev`, `package`: crates/testbed and e2e/'s hcp-fleet-dev).
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
build() {
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static --remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$PWD=/src" \
    cargo build --release --locked --no-default-features --features "$features" --target "$target" -p hcp-fleet-cli --bin hcp-fleet-agent >&2
}
before="$(stat -c %Y "$binary" 2>/dev/null || echo none)"
build
recompiled=yes
[ "$before" != none ] && [ "$(stat -c %Y "$binary")" = "$before" ] && recompiled=no
interp="$(readelf -l "$binary" 2>/dev/null | grep -c 'Requesting program interpreter' || true)"
[ "$interp" = 0 ] || die "$binary is dynamically linked"
say "static binary: $binary ($(du -h "$binary" | cut -f1))"
[ "${1:-}" = binary ] && exit 0

# SOURCE_DATE_EPOCH: the commit's time, so the image's dates say which source it is, not when
# it was built (a tree outside git: 0).
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
mkdir -p "$work"
archive="$work/hcp-fleet-agent.oci.tar"
write() { python3 hack/oci-image.py Containerfile "$repository:$tag" "$tag" "$revision" "$epoch" "$archive" "$binary"; }
digest="$(write)" || die "cannot write the image"
echo "$digest" >"$work/hcp-fleet-agent.oci.digest"
say "$repository:$tag@$digest -> $archive ($(du -h "$archive" | cut -f1))"
if [ "${1:-}" = reproduce ]; then
  # The project's own crates compiled again from scratch (its dependencies are cargo's cached
  # builds of the same locked sources), and the image written again. A binary cargo did not
  # compile this time, whose bytes are the ones an earlier run compiled twice to one image, has
  # shown it already: it is not compiled a third time (`make test` with nothing changed).
  first="$digest"
  verified="$work/hcp-fleet-agent.reproduced"
  sum="$(sha256sum "$binary" | cut -d' ' -f1)"
  if [ "$recompiled" = no ] && [ "$(cat "$verified" 2>/dev/null)" = "$sum" ]; then
    say "reproduced earlier: this binary (sha256:$sum) is the second of two compiles that gave one image; not compiled again"
  else
    rm -f "$verified"
    cargo clean --release --target "$target" -p hcp-fleet-model -p hcp-fleet-guards -p hcp-fleet-render \
      -p hcp-fleet-webhook -p hcp-fleet-agent -p hcp-fleet-cli >&2
    build
    digest="$(write)" || die "cannot write the image"
    [ "$digest" = "$first" ] || die "two builds of one source gave two images: $first, then $digest"
    sha256sum "$binary" | cut -d' ' -f1 >"$verified"
    say "reproduced: the binary compiled again gives the same image, $digest"
  fi
fi
SBOM_FEATURES="$features" bash hack/sbom.sh "$binary" "$repository:$tag" "$digest" "$epoch" "$work" >&2
echo "$archive"
