#!/usr/bin/env bash
# The advisory check: cargo-deny (installed from crates.io, cached outside the repo) enforces
# deny.toml's bans (crates with RustSec advisories that matter here, and a second crypto
# provider) and sources (crates.io only). The full RustSec scan (`check advisories`) runs when
# a RustSec database is on this machine; this workplace cannot fetch one, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${HCP_FLEET_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hcp-fleet-agent/tools}"
DENY_VERSION="0.20.2"
DENY="$TOOLS/bin/cargo-deny"
say() { printf '[advisories] %s\n' "$*" >&2; }

if ! { [ -x "$DENY" ] && "$DENY" --version 2>/dev/null | grep -q "$DENY_VERSION"; }; then
  say "installing cargo-deny $DENY_VERSION into $TOOLS (once; a few minutes)"
  # A cheap release profile: the tool's own speed does not matter here (a check takes under a
  # second either way), its build time does on a cold CI run (2 min 25 s instead of 3 min 42 s).
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=false \
    CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo install --locked --quiet --root "$TOOLS" --version "$DENY_VERSION" cargo-deny >&2
fi

"$DENY" --log-level warn check bans licenses sources
say "bans, licences and sources: ok"

DB_ROOT="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
if compgen -G "$DB_ROOT/*/crates" >/dev/null; then
  "$DENY" --log-level warn check --disable-fetch advisories
  say "RustSec advisories: ok"
else
  say "RustSec database not present in $DB_ROOT and not reachable from this network;"
  say "the banned-crate list in deny.toml stands in for it (run 'cargo deny fetch' where it is)."
fi
