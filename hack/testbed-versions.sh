#!/usr/bin/env bash
# Prints one KUBEBUILDER_ASSETS directory per test-bed version available here, oldest first,
# building what is missing (hack/testbed-assets.sh). `make test` runs the e2e suite once per
# line; `make demo` takes the last (newest).
#
# - KUBEBUILDER_ASSETS set: that directory alone (any version from 1.20 up).
# - Otherwise 1.20.2 (from Debian's packages, always), then 1.36.2 where its source bundle is
#   present (../shared/testbed beside the clone, or HCP_FLEET_K8S_SRC); without it, one line on
#   stderr says so and only 1.20.2 is listed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  exec bash hack/testbed-assets.sh
fi
bash hack/testbed-assets.sh 1.20
rc=0
dir=$(bash hack/testbed-assets.sh 1.36) || rc=$?
case "$rc" in
  0) printf '%s\n' "$dir" ;;
  3) ;; # no bundle: the 1.36 script said so in one line
  *) exit "$rc" ;;
esac
