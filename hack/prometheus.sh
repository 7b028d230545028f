#!/usr/bin/env bash
# Prints the paths of promtool and prometheus (Debian's `prometheus` package), installing the
# package with apt-get when they are missing: the alert rules' unit tests and the check of
# every dashboard query and alert expression against a real Prometheus (e2e/monitoring.rs).
#
#   eval "$(hack/prometheus.sh)"   # sets PROMTOOL and PROMETHEUS
#
# Where the package cannot be had (no apt, no network), one line says so on stderr and
# nothing is set: those tests then say in one line what they skipped.
set -euo pipefail

say() { printf '[prometheus] %s\n' "$*" >&2; }

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  if command -v apt-get >/dev/null 2>&1; then
    say "installing Debian's prometheus package (promtool and the server) with apt-get"
    # No recommends: the node exporter and the web console's JavaScript are not needed. The
    # package's service is not started here (no init system runs it in a test machine).
    log="${HCP_FLEET_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent}/apt-prometheus.log"
    mkdir -p "$(dirname "$log")"
    { $sudo apt-get install -y -qq --no-install-recommends prometheus \
      || { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends prometheus; }; } >"$log" 2>&1 \
      || say "apt-get install prometheus failed (log: $log)"
  fi
fi
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  echo "export PROMTOOL=$(command -v promtool) PROMETHEUS=$(command -v prometheus)"
else
  say "promtool and prometheus are not available: the alert rule tests and the Prometheus check are skipped"
fi
