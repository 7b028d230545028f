#!/usr/bin/env bash
# `make test` up to the image: the unit tests once, then the e2e suite once per test-bed version
# (hack/testbed-versions.sh).
#
# Two overlaps keep a cold run short on two cores:
# - the test-bed binaries build (minutes, when not cached) while cargo compiles the tests;
# - the versions' e2e suites run side by side. One suite keeps about one core busy (its API
#   servers and agents mostly wait on one another), so two together take about as long as the
#   longer one, not the sum. Each suite's output is printed whole when it ends, and any
#   failure fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo="${CARGO:-cargo}"
work="$(mktemp -d)"
tb_pid=""
cleanup() {
  [ -n "$tb_pid" ] && kill "$tb_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

bash hack/testbed-versions.sh >"$work/versions" &
tb_pid=$!
"$cargo" test --lib --bins
"$cargo" test --no-run --test '*'
wait "$tb_pid" || { echo "[test] the test bed could not be built (above)" >&2; exit 1; }
tb_pid=""
mapfile -t versions <"$work/versions"
[ "${#versions[@]}" -gt 0 ] || { echo "[test] no test-bed version" >&2; exit 1; }

label() { echo "$("$1/kube-apiserver" --version) ($1)"; }
pids=()
for i in "${!versions[@]}"; do
  assets="${versions[$i]}"
  echo "== e2e on $(label "$assets"): started =="
  KUBEBUILDER_ASSETS="$assets" "$cargo" test --test '*' >"$work/e2e-$i.log" 2>&1 &
  pids+=("$!")
done
rc=0
for i in "${!versions[@]}"; do
  if wait "${pids[$i]}"; then result=passed; else result=FAILED; rc=1; fi
  echo "== e2e on $(label "${versions[$i]}"): $result =="
  cat "$work/e2e-$i.log"
done
exit "$rc"
