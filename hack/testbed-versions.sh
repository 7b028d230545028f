#!/usr/bin/env bash
# Prints one KUBEBUILDER_ASSETS directory per test-bed version available here, oldest first,
# building what is missing (hack/testbed-assets.sh). `make test` runs the e2e suite once per
# line; `make demo` takes the last (newest).
#
# - KUBEBUILDER_ASSETS set: that directory alone (any version from 1.20 up, the user's own
#   binaries; docs/testbed.md, "Newer versions").
# - Otherwise v1.20.2, built from Debian's packages (the only server the package registries
#   offer here); one line on stderr says how to add a newer one.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  exec bash hack/testbed-assets.sh
fi
bash hack/testbed-assets.sh
echo "[testbed] v1.20.2 only: features of newer servers (ValidatingAdmissionPolicy, CRD CEL rules, matchConditions) are checked by the CEL interpreter in the unit tests; set KUBEBUILDER_ASSETS to 1.30+ binaries to run them against a real server too" >&2
