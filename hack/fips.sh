#!/usr/bin/env bash
# The FIPS variant: the binary built with the feature `fips` (AWS-LC's FIPS module through
# aws-lc-rs; rustls's FIPS provider), in a target directory of its own (target/fips).
#
#   hack/fips.sh          its tests, then its image (`make fips`):
#                         - the crypto unit test: FIPS mode on, no ChaCha20 suite;
#                         - the admission service seen from OpenSSL's client: TLS 1.3 and 1.2
#                           with AES-GCM only, and `version` saying `fips: true`;
#                         - the smoke test through a real kube-apiserver: the agent (FIPS)
#                           installs every guard, and the hosted kube-apiserver calls the
#                           FIPS admission service over TLS for each;
#                         - the image variant, checked reproducible (hack/image.sh reproduce), with its SBOMs, run
#                           alone (hack/image-check.sh), reporting FIPS mode.
#   hack/fips.sh image    the image variant only (`make image-fips`)
#
# AWS-LC's FIPS build needs cmake and Go: Debian's packages, installed with apt-get when
# missing (Go is the one the test bed already installs).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[fips] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

. hack/apt.sh
command -v cmake >/dev/null || apt_install cmake || die "cmake is needed for AWS-LC's FIPS build"
command -v go >/dev/null || apt_install golang-go || die "Go is needed for AWS-LC's FIPS build"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/fips}"
features=(--no-default-features --features fips)

if [ "${1:-}" != image ]; then
  start=$SECONDS
  cargo build --locked "${features[@]}" -p hcp-fleet-cli -p hcp-fleet-e2e --bins --test admission >&2
  say "built the FIPS variant's tests in $((SECONDS - start)) s"
  cargo test --locked "${features[@]}" -p hcp-fleet-guards --lib crypto:: >&2
  assets="$(bash hack/testbed-versions.sh | tail -n 1)"
  KUBEBUILDER_ASSETS="$assets" cargo test --locked "${features[@]}" -p hcp-fleet-e2e --test admission -- \
    the_service_offers_its_builds_protocols_and_suites_only \
    each_guard_answers_through_its_webhook >&2
fi
IMAGE_VARIANT=fips bash hack/image.sh reproduce >/dev/null
IMAGE_VARIANT=fips bash hack/image-check.sh target/image-fips/hcp-fleet-agent.oci.tar
