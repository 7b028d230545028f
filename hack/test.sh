#!/usr/bin/env bash
# `make test`: the unit tests once, then the e2e suite once per test-bed version
# (hack/testbed-versions.sh: v1.20.2 from Debian's packages, or the KUBEBUILDER_ASSETS
# directory alone), then the container image: built to one digest twice, its binary held to
# the recorded build of the same inputs or compiled twice (hack/image.sh reproduce), with its
# SBOMs, and run alone (hack/image-check.sh).
#
# Three overlaps keep a cold run short on two cores:
# - the test-bed binaries build (minutes, when not cached) while cargo compiles the tests;
# - the e2e test binaries run in two lanes side by side. One suite keeps about one core busy
#   (its API servers and agents mostly wait on one another), so two lanes take about as long
#   as the longer one, not the sum. Each lane's output is printed whole when it ends, and any
#   failure fails the run;
# - the image's release build (about 6 min of two cores when cold) runs from the start at the
#   lowest CPU and I/O priority, so it takes only what the tests leave idle (the e2e lanes
#   mostly wait) and never slows them. Its output is printed when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo="${CARGO:-cargo}"
work="$(mktemp -d)"
tb_pid=""
image_pid=""
# A background job's whole process tree (its cargo and rustc too), children first.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}
cleanup() {
  [ -n "$tb_pid" ] && kill_tree "$tb_pid"
  [ -n "$image_pid" ] && kill_tree "$image_pid"
  rm -rf "$work"
}
trap cleanup EXIT

# Reference CRDs from ../shared, for the tests only (docs/testbed.md, "Binaries").
upstream="$(cd .. && pwd)/shared/crds/upstream"
if [ -z "${HCP_FLEET_UPSTREAM_CRDS:-}" ] && [ -d "$upstream" ]; then
  export HCP_FLEET_UPSTREAM_CRDS="$upstream"
elif [ -z "${HCP_FLEET_UPSTREAM_CRDS:-}" ]; then
  echo "[test] no ../shared/crds/upstream: the tests use the repository's own CRDs instead of ACM's and HyperShift's"
fi

start=$SECONDS
bash hack/testbed-versions.sh >"$work/versions" &
tb_pid=$!
(
  image_start=$SECONDS
  nice -n 19 ionice -c 3 bash hack/image.sh reproduce >/dev/null
  echo "[test] the image took $(( (SECONDS - image_start) / 60 )) min $(( (SECONDS - image_start) % 60 )) s at idle priority, beside the tests"
) >"$work/image.log" 2>&1 &
image_pid=$!
# The e2e tests are built and run with `--workspace` as the unit tests are: the same features
# for every crate (each member's defaults, the guards' `testing` that render's and webhook's
# tests turn on), so they reuse the unit build's crates instead of compiling the workspace
# again (`-p hcp-fleet-e2e` resolves them without those: about two minutes of a cold run).
"$cargo" test --workspace --lib --bins
unit_done=$SECONDS
"$cargo" test --workspace --no-run --tests
built=$SECONDS
wait "$tb_pid" || { echo "[test] the test bed could not be built (above)" >&2; exit 1; }
tb_pid=""
bed_ready=$SECONDS
mapfile -t versions <"$work/versions"
[ "${#versions[@]}" -gt 0 ] || { echo "[test] no test-bed version" >&2; exit 1; }

# Two lanes of about equal length (measured on 1.20.2 with the hosted clusters' data planes,
# the patches of hack/testbed-patches and the servers' Go runtime settings of src/testbed,
# the two lanes alone, 2026-12-02: admission 281 s + data_plane 25 + packaging 71 + testbed 24
# = 401; acm 24 + agent 222 + monitoring 20 + rollout 106 + tenant 42 = 414).
lanes=("--test admission --test packaging --test testbed --test data_plane" "--test agent --test rollout --test acm --test monitoring --test tenant")
# Every [[test]] of e2e/Cargo.toml runs in one lane: a new e2e binary left out fails here.
for t in $(awk '/^\[\[test\]\]/{t=1} t && /^name *=/{gsub(/[" ]/,"",$0); sub(/name=/,""); print; t=0}' e2e/Cargo.toml); do
  [[ " ${lanes[*]} " == *" --test $t "* ]] || { echo "[test] e2e binary '$t' is in no lane of hack/test.sh" >&2; exit 1; }
done
label() { echo "$("$1/kube-apiserver" --version) ($1)"; }
rc=0
for assets in "${versions[@]}"; do
  echo "== e2e on $(label "$assets"): started =="
  pids=()
  for i in "${!lanes[@]}"; do
    # shellcheck disable=SC2086 # the lane is a list of cargo arguments
    KUBEBUILDER_ASSETS="$assets" "$cargo" test --workspace --no-fail-fast ${lanes[$i]} >"$work/e2e-$i.log" 2>&1 &
    pids+=("$!")
  done
  result=passed
  for i in "${!lanes[@]}"; do
    if ! wait "${pids[$i]}"; then result=FAILED; rc=1; fi
    echo "== e2e lane $((i + 1)) (${lanes[$i]}) =="
    cat "$work/e2e-$i.log"
  done
  echo "== e2e on $(label "$assets"): $result =="
done
echo "[test] unit and e2e tests took $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s: unit tests built and run $(( unit_done - start )) s, e2e built $(( built - unit_done )) s, $(( bed_ready - built )) s more waiting for the test bed, the e2e lanes $(( SECONDS - bed_ready )) s"
[ "$rc" = 0 ] || exit "$rc"
echo "== the container image =="
waited=$SECONDS
image_rc=0
wait "$image_pid" || image_rc=$?
image_pid=""
cat "$work/image.log"
[ "$image_rc" = 0 ] || { echo "[test] the image could not be built or reproduced (above)" >&2; exit 1; }
echo "[test] waited $(( SECONDS - waited )) s for the image after the tests"
bash hack/image-check.sh
echo "[test] make test took $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
