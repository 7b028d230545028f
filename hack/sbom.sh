#!/usr/bin/env bash
# CycloneDX SBOMs of the image's binary and of the image, written beside the image archive:
#
#   hack/sbom.sh BINARY IMAGE-REF IMAGE-DIGEST EPOCH OUT-DIR
#
#   OUT-DIR/hcp-fleet-agent.bin.cdx.json    the binary: every crate compiled into it, from
#                                           cargo-cyclonedx (crates.io, cached outside the repo)
#                                           for the image's build (no default features, the
#                                           image's target), with the binary's SHA-256
#   OUT-DIR/hcp-fleet-agent.oci.cdx.json    the image: a container component named by its
#                                           digest, holding the binary and its crates
#
# hack/image.sh calls it. Both are checked against Cargo.lock before they are written
# (hack/sbom-check.py): every crate the binary's build resolves is listed, with its version,
# checksum and package URL, and every crate of Cargo.lock is either listed or is one the
# binary does not contain (tests, benches, the test bed, other platforms), each counted.
# Dated EPOCH and numbered from the image's digest, so one commit writes one SBOM.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# = 5 ] || { echo "usage: hack/sbom.sh BINARY IMAGE-REF IMAGE-DIGEST EPOCH OUT-DIR" >&2; exit 2; }
binary="$1" ref="$2" digest="$3" epoch="$4" out="$5"
say() { printf '[sbom] %s\n' "$*" >&2; }
TOOLS="${HCP_FLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent/tools}"
CDX_VERSION="0.5.9"
CDX="$TOOLS/bin/cargo-cyclonedx"
target=x86_64-unknown-linux-gnu

if ! { [ -x "$CDX" ] && "$CDX" cyclonedx --version 2>/dev/null | grep -q "$CDX_VERSION"; }; then
  say "installing cargo-cyclonedx $CDX_VERSION into $TOOLS (once; a few minutes)"
  # As for cargo-deny: the tool's speed does not matter (1.5 s instead of 0.2 s, the same
  # SBOM), its build time on a cold run does (43 s instead of 93 s at opt-level 1).
  CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo install --locked --quiet --root "$TOOLS" --version "$CDX_VERSION" cargo-cyclonedx >&2
fi

# cargo-cyclonedx writes beside each Cargo.toml of the workspace; the image's binary is the cli
# crate's, whose file is moved from there at once and the others removed.
raw="hcp-fleet-agent.sbom-raw"
members=(src/*/ e2e/)
clean() { for m in "${members[@]}"; do rm -f "$m$raw.json"; done; }
clean
"$CDX" cyclonedx --quiet --format json --spec-version 1.5 --no-default-features --features "${SBOM_FEATURES:-ring}" \
  --target "$target" --override-filename "$raw" --manifest-path src/cli/Cargo.toml >&2
mv "src/cli/$raw.json" "$out/cargo-cyclonedx.json"
clean
# The crates the image's build compiles, as cargo resolves them (normal and build
# dependencies, the image's features and target), to hold the SBOM to.
cargo tree --locked -p hcp-fleet-cli --no-default-features --features "${SBOM_FEATURES:-ring}" --target "$target" -e normal,build \
  --prefix none --format '{p}' --no-dedupe 2>/dev/null | sort -u >"$out/binary-crates.txt"
python3 hack/sbom-check.py "$out/cargo-cyclonedx.json" "$out/binary-crates.txt" Cargo.lock \
  "$binary" "$ref" "$digest" "$epoch" "$out"
rm -f "$out/cargo-cyclonedx.json" "$out/binary-crates.txt"
