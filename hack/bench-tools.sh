#!/usr/bin/env bash
# What the admission benchmark compares with, installed and cached outside the repository:
# wrk (Debian's package) and the Go anchor (e2e/anchor/main.go, built with Debian's golang-go).
#
#   eval "$(hack/bench-tools.sh)"     # sets BENCH_WRK and BENCH_ANCHOR
#
# Either missing (no apt, no network) is said on stderr and left unset: the benchmark then
# prints its own load generator's figures only, and says what it skipped.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE_ROOT="${HCP_FLEET_ASSETS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent}"
OUT="$CACHE_ROOT/bench"
say() { printf '[bench-tools] %s\n' "$*" >&2; }

# shellcheck source=hack/apt.sh
. "$ROOT/hack/apt.sh"

command -v wrk >/dev/null || apt_install wrk || say "wrk is not available; the wrk rows are skipped"
command -v go >/dev/null || apt_install golang-go || say "go is not available; the Go anchor is skipped"

if command -v wrk >/dev/null; then
  echo "export BENCH_WRK=$(command -v wrk)"
fi
if command -v go >/dev/null; then
  mkdir -p "$OUT"
  src="$ROOT/e2e/anchor/main.go"
  sum="$(sha256sum "$src" | cut -c1-16)-$(go env GOVERSION)"
  bin="$OUT/anchor-$sum"
  if [ ! -x "$bin" ]; then
    say "building the Go anchor ($(go version))"
    (cd "$OUT" && GO111MODULE=off GOCACHE="$OUT/go-build" go build -o "$bin.tmp" "$src" && mv "$bin.tmp" "$bin")
  fi
  echo "export BENCH_ANCHOR=$bin"
fi
