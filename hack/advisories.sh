#!/usr/bin/env bash
# The supply-chain check of `make lint`: cargo-deny (installed from crates.io, cached outside the
# repo) enforces deny.toml's bans (crates with RustSec advisories that matter here, and a second
# crypto provider), licences and sources (crates.io only), then scans Cargo.lock against the
# RustSec advisory database: the snapshot in ../shared/rustsec (this workplace cannot fetch
# one), installed where cargo-deny looks for it, as that directory's README says. Any advisory
# that applies fails the check; the only ignores are deny.toml's, each with its reason. Without
# the snapshot (and without a database already installed) one line says the scan is skipped.
#
#   hack/advisories.sh                  bans, licences and sources, then the RustSec scan
#   hack/advisories.sh scan MANIFEST    the RustSec scan alone, of another Cargo.toml under
#                                       this repository's deny.toml (the check's own test,
#                                       e2e/packaging/supply_chain.rs, scans a crate that
#                                       depends on one with a known advisory)
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${HCP_FLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent/tools}"
DENY_VERSION="0.20.2"
DENY="$TOOLS/bin/cargo-deny"
say() { printf '[advisories] %s\n' "$*" >&2; }

if ! { [ -x "$DENY" ] && "$DENY" --version 2>/dev/null | grep -q "$DENY_VERSION"; }; then
  say "installing cargo-deny $DENY_VERSION into $TOOLS (once; a few minutes)"
  # An unoptimised build: the tool's own speed does not matter here (the whole check takes 3 s
  # instead of 1.5 s), its build time does on a cold CI run (72 s here, where the optimised
  # one took minutes).
  CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo install --locked --quiet --root "$TOOLS" --version "$DENY_VERSION" cargo-deny >&2
fi

manifest=()
if [ "${1:-}" = scan ]; then
  [ -f "${2:-}" ] || { say "error: scan needs a Cargo.toml"; exit 2; }
  manifest=(--manifest-path "$2")
  # Every crate of its lock file (other platforms' included) in cargo's registry, which the
  # offline scan needs: a scan must not depend on a lint run having fetched them first.
  cargo fetch --quiet --manifest-path "$2"
else
  # Online: it also puts every crate of Cargo.lock (other platforms' included) in cargo's
  # registry, which the offline advisory scan below needs.
  "$DENY" --log-level warn check bans licenses sources
  say "bans, licences and sources: ok"
fi

# The snapshot: ../shared/rustsec/advisory-db.tar.xz (or HCP_FLEET_RUSTSEC), checked against
# its published SHA-256 and unpacked once per snapshot under cargo-deny's own directory for its
# default database URL (the name is that URL's hash; see the snapshot's README).
SNAPSHOT="${HCP_FLEET_RUSTSEC:-$(cd .. && pwd)/shared/rustsec/advisory-db.tar.xz}"
SNAPSHOT_SHA256="0c430f5897da1e0c424b479622e2c35f3bd81182dc8c4fd9e2ad33a98221d6a4"
DB_ROOT="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
DB_DIR="$DB_ROOT/advisory-db-3157b0e258782691"
if [ -f "$SNAPSHOT" ]; then
  stamp="$DB_DIR/.hcp-fleet-snapshot"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$SNAPSHOT_SHA256" ]; then
    echo "$SNAPSHOT_SHA256  $SNAPSHOT" | sha256sum -c --quiet - >&2 \
      || { say "error: $SNAPSHOT does not have the SHA-256 its README gives"; exit 1; }
    mkdir -p "$DB_ROOT"
    rm -rf "$DB_DIR"
    # Plain tar: the archive's dates are the database's age, which cargo-deny checks.
    tar -xJf "$SNAPSHOT" -C "$DB_ROOT"
    printf '%s\n' "$SNAPSHOT_SHA256" >"$stamp"
    say "RustSec snapshot installed in $DB_DIR"
  fi
fi
if [ -d "$DB_DIR/crates" ]; then
  loaded="$(find "$DB_DIR/crates" -name '*.md' | wc -l)"
  say "RustSec database: $loaded advisories loaded from $DB_DIR"
  "$DENY" --log-level warn --offline --config "$PWD/deny.toml" "${manifest[@]}" check advisories
  if [ ${#manifest[@]} = 0 ]; then
    # The FIPS variant's graph too (AWS-LC instead of ring; `make fips`).
    "$DENY" --log-level warn --offline --config "$PWD/deny.toml" --no-default-features \
      --features fips check advisories
  fi
  say "RustSec advisories: none of the $loaded applies"
else
  say "skipped the RustSec scan: no snapshot at $SNAPSHOT and no database in $DB_DIR"
fi
