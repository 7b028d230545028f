#!/usr/bin/env bash
# Builds the image of Containerfile as an OCI archive without a container engine.
#
#   hack/image.sh            the static release binary, then target/image/hcp-fleet-agent.oci.tar
#   hack/image.sh binary     only the static binary (for buildah/podman/docker with Containerfile)
#   hack/image.sh name       only the image's name (hack/image-check.sh reads it here)
#   hack/image.sh reproduce  the image, written twice to one digest, and its binary held to
#                            hack/image-reproduced.txt: the recorded binary of the same inputs,
#                            or, where none is recorded, compiled again to the same bytes and
#                            recorded (`make test` runs this)
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
# supervision, the stand-in kubelet, `dev`, `package`: src/testbed and e2e/'s hcp-fleet-dev).
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
rustflags="${RUSTFLAGS:-} -C target-feature=+crt-static --remap-path-prefix=$cargo_home=/cargo --remap-path-prefix=$PWD=/src"
cargo_args=(--release --locked --no-default-features --features "$features" --target "$target" -p hcp-fleet-cli --bin hcp-fleet-agent)
# SOURCE_DATE_EPOCH=0 for the compile: C that a build script compiles may print its compile's
# clock (mimalloc's options.c has __DATE__ and __TIME__ in its verbose banner), which GCC takes
# from SOURCE_DATE_EPOCH when it is set. A fixed value, not the commit's time: committing the
# record below makes a new commit, and the binary must not change with it.
build() { SOURCE_DATE_EPOCH=0 RUSTFLAGS="$rustflags" cargo build "${cargo_args[@]}" >&2; }
build
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
  # Two builds of one source must give one image. The image is written again from the binary
  # (the writer's half). The binary's half: hack/image-reproduced.txt records, per variant, the
  # fingerprint of everything a compile read (hack/image-inputs.py: the toolchain, the system's
  # C and link inputs, Cargo.lock, the manifests, every source file) and the binary it gave.
  # - A record of this build's inputs: the binary compiled here must be the recorded one, byte
  #   for byte. That is a second build on another machine, in another checkout and CARGO_HOME,
  #   without compiling twice here (a cold CI run saves the second release compile).
  # - No record of them (the sources changed since it was written): the project's crates are
  #   compiled again from scratch here (their dependencies are cargo's cached builds of the same
  #   locked sources), the two binaries must be one, and the record is rewritten: commit it with
  #   the change, and the next build of these sources elsewhere is checked against it.
  first="$digest"
  digest="$(write)" || die "cannot write the image"
  [ "$digest" = "$first" ] || die "one binary written twice gave two images: $first, then $digest"
  record="hack/image-reproduced.txt"
  variant="${IMAGE_VARIANT:-default}"
  inputs="$(python3 hack/image-inputs.py "$binary.d" "$cargo_home" "${cargo_args[*]} RUSTFLAGS=$rustflags SOURCE_DATE_EPOCH=0" "$work/hcp-fleet-agent.inputs")" \
    || die "cannot fingerprint the binary's inputs"
  sum="$(sha256sum "$binary" | cut -d' ' -f1)"
  recorded="$(awk -v v="$variant" -v i="$inputs" '$1 == v && $2 == i { print $3 }' "$record" 2>/dev/null || true)"
  if [ -n "$recorded" ]; then
    [ "$recorded" = "$sum" ] || die "not reproducible: the inputs $inputs gave sha256:$recorded where $record was written and sha256:$sum here ($work/hcp-fleet-agent.inputs lists them)"
    say "reproduced: compiled from the inputs $record names ($inputs), the binary is the recorded one, sha256:$sum, and the image $digest"
  else
    say "no record of these inputs ($inputs) in $record: compiling the project's crates again"
    # libmimalloc-sys too: its C is where a compile's clock got in once (above), and a cached
    # object would hide it again.
    cargo clean --release --target "$target" -p hcp-fleet-model -p hcp-fleet-guards -p hcp-fleet-render \
      -p hcp-fleet-webhook -p hcp-fleet-agent -p hcp-fleet-cli -p libmimalloc-sys >&2
    build
    digest="$(write)" || die "cannot write the image"
    [ "$digest" = "$first" ] || die "two builds of one source gave two images: $first, then $digest"
    again="$(sha256sum "$binary" | cut -d' ' -f1)"
    [ "$again" = "$sum" ] || die "two builds of one source gave two binaries: sha256:$sum, then sha256:$again"
    {
      echo "# hack/image.sh reproduce: per image variant, the fingerprint of everything its binary's"
      echo "# compile read (hack/image-inputs.py) and the binary's SHA-256, written after two"
      echo "# compiles gave one binary. A build of the same inputs elsewhere must give this binary."
      grep -v '^#' "$record" 2>/dev/null | awk -v v="$variant" '$1 != v' || true
      echo "$variant $inputs $sum"
    } >"$record.tmp"
    mv "$record.tmp" "$record"
    say "reproduced: the binary compiled again gives the same image, $digest; recorded in $record (commit it with the change)"
  fi
fi
SBOM_FEATURES="$features" bash hack/sbom.sh "$binary" "$repository:$tag" "$digest" "$epoch" "$work" >&2
echo "$archive"
