#!/usr/bin/env bash
# Writes the fleet rollout files (default: policies/) from the rendered chart.
#
#   hack/policies.sh [OUT_DIR]
#
# `make policies` runs it on policies/; e2e/packaging.rs runs it on a temporary directory and
# fails when the committed files differ, so this is the one place the rendering is defined.
# HCP_FLEET_AGENT_BIN names a binary with the `package` command (default
# target/debug/hcp-fleet-dev, the test bed's build: the image's has no `package`).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-policies}"
bin="${HCP_FLEET_AGENT_BIN:-target/debug/hcp-fleet-dev}"
[ -x "$bin" ] || { echo "[policies] error: $bin is not built (cargo build -p hcp-fleet-e2e --bin hcp-fleet-dev)" >&2; exit 1; }
helm="$(bash hack/helm.sh)"
rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
# managedBy: the objects on management clusters are kept by the ACM Policy, not by Helm; and
# no hooks: the pre-delete uninstall Job is Helm's, ACM never runs it (docs/operations.md).
# The management clusters are OpenShift, whose monitoring serves the Prometheus Operator's API:
# the ServiceMonitor and PrometheusRule go out with the rest (helm template cannot ask).
"$helm" template hcp-fleet-agent charts/hcp-fleet-agent --no-hooks \
  --namespace hcp-fleet-agent --set managedBy=acm-policy \
  --api-versions monitoring.coreos.com/v1/ServiceMonitor \
  --api-versions monitoring.coreos.com/v1/PrometheusRule >"$rendered"
"$bin" package policies --rendered "$rendered" --out "$out"
