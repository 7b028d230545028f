#!/usr/bin/env bash
# Checks the archive `make image` wrote, as a runtime would take it, and runs its binary alone.
#
#   hack/image-check.sh [ARCHIVE]     default target/image/hcp-fleet-agent.oci.tar
#
# - every blob matches its digest; the image is named as the chart's default image;
# - its user is numeric and not root; its entrypoint is the binary;
# - its one layer unpacks (GNU tar) to exactly that binary;
# - the binary runs in that filesystem as the image's user, with only what the kubelet adds
#   (/etc/hosts, the service account's CA, token and namespace): it prints its version, and
#   with the in-cluster configuration pointing at a name from /etc/hosts on a closed port it
#   gets as far as connecting (name resolved, CA loaded), which a static glibc binary without
#   NSS files or a CA bundle would not;
# - it was built without the test bed: no `dev`, `package` or `webhook-baseline` command (the
#   admission bench's fixed-response server), `webhook --baseline` and `--local-mode` refused.
# chroot needs root; as another user it runs under `unshare -r`.
set -euo pipefail
cd "$(dirname "$0")/.."
archive="${1:-target/image/hcp-fleet-agent.oci.tar}"
say() { echo "[image-check] $*" >&2; }
die() { say "error: $*"; exit 1; }
[ -f "$archive" ] || die "$archive not found (make image)"
image="$(bash hack/image.sh name)" || die "cannot tell the image's name"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/layout" "$work/rootfs"
tar -xf "$archive" -C "$work/layout"
for blob in "$work"/layout/blobs/sha256/*; do
  [ "$(sha256sum "$blob" | cut -c1-64)" = "$(basename "$blob")" ] || die "blob $(basename "$blob") does not match its digest"
done
# index -> manifest -> config and layers; prints: user, entrypoint, then one layer digest per line.
facts="$(python3 - "$work/layout" "$image" <<'PY'
import json, sys
root, want_ref = sys.argv[1], sys.argv[2]
def blob(d): return json.load(open(f"{root}/blobs/sha256/{d.split(':', 1)[1]}"))
index = json.load(open(f"{root}/index.json"))
[desc] = index["manifests"]
ref = desc.get("annotations", {}).get("org.opencontainers.image.ref.name")
if ref != want_ref: sys.exit(f"image name {ref!r}, not the chart's default {want_ref!r}")
manifest = blob(desc["digest"])
config = blob(manifest["config"]["digest"])
c = config["config"]
print(c.get("User", ""))
print(" ".join(c.get("Entrypoint") or []))
for layer in manifest["layers"]: print(layer["digest"].split(":", 1)[1])
PY
)" || die "the image's index, manifest or config is not as expected"
user="$(sed -n 1p <<<"$facts")"
entrypoint="$(sed -n 2p <<<"$facts")"
[[ "$user" =~ ^[0-9]+:[0-9]+$ ]] || die "user '$user' is not numeric uid:gid"
[ "${user%%:*}" != 0 ] || die "the image runs as root"
for layer in $(sed -n '3,$p' <<<"$facts"); do
  tar -xzf "$work/layout/blobs/sha256/$layer" -C "$work/rootfs" || die "layer $layer does not unpack"
done
files="$(cd "$work/rootfs" && find . -type f | sort)"
[ "$files" = "./usr/bin/hcp-fleet-agent" ] || die "the image holds more than the binary: $files"
[ "$entrypoint" = /usr/bin/hcp-fleet-agent ] || die "entrypoint '$entrypoint'"

# What the kubelet adds to every pod.
sa="$work/rootfs/var/run/secrets/kubernetes.io/serviceaccount"
mkdir -p "$work/rootfs/etc" "$sa"
echo "127.0.0.1 kube-apiserver.image-check.svc" >"$work/rootfs/etc/hosts"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=image-check \
  -keyout "$work/ca.key" -out "$sa/ca.crt" 2>/dev/null
printf token >"$sa/token"
printf hcp-fleet-agent >"$sa/namespace"
chmod -R a+rX "$work/rootfs"
chroot_bin="$(command -v chroot)" || die "chroot not found (coreutils)"
run() {
  local prefix=()
  [ "$(id -u)" = 0 ] || prefix=("$(command -v unshare)" -r)
  # An empty environment but for what the kubelet sets for in-cluster access.
  env -i KUBERNETES_SERVICE_HOST=kube-apiserver.image-check.svc KUBERNETES_SERVICE_PORT=1 RUST_LOG="${CHECK_LOG:-off}" \
    "${prefix[@]}" "$chroot_bin" --userspec="$user" "$work/rootfs" "$entrypoint" "$@"
}
out="$(run --version)" || die "the binary does not run alone: $out"
say "runs alone as $user: $out"
# Its crypto library, and FIPS mode exactly in the FIPS variant.
out="$(run version)" || die "version: $out"
want_fips=false; [ "${IMAGE_VARIANT:-}" = fips ] && want_fips=true
grep -qx "fips: $want_fips" <<<"$out" || die "expected fips: $want_fips from version:"$'\n'"$out"
say "$(grep '^crypto:' <<<"$out"), fips: $want_fips"
# Nothing listens on port 1: the uninstall command must fail there, having resolved the name
# to the address /etc/hosts gives (the HTTP connector logs where it connects).
out="$(CHECK_LOG=hyper_util::client::legacy::connect::http=debug run uninstall --namespace hcp-fleet-agent 2>&1 || true)"
grep -q "connecting to 127.0.0.1:1" <<<"$out" \
  || die "in-cluster access does not get as far as connecting:"$'\n'"$out"
say "in-cluster configuration loaded, kube-apiserver.image-check.svc resolved from /etc/hosts"
# Built without the test bed: no `dev`, `package` or `webhook-baseline` command, and neither
# --local-mode nor the bench's fixed-response server (which allows every review) accepted.
for cmd in dev package webhook-baseline; do
  out="$(run "$cmd" --help 2>&1)" && die "the image's binary has the test bed's '$cmd' command"
  grep -q "unrecognized subcommand" <<<"$out" || die "'$cmd': $out"
done
out="$(run agent --local-mode 2>&1)" && die "the image's binary accepted --local-mode"
grep -q "needs the test bed, which this build leaves out" <<<"$out" || die "--local-mode: $out"
out="$(run webhook --baseline 2>&1)" && die "the image's binary accepted webhook --baseline"
grep -q "unexpected argument '--baseline'" <<<"$out" || die "webhook --baseline: $out"
say "built without the test bed: no dev, package or webhook-baseline command, --local-mode and webhook --baseline refused"
# The SBOMs beside the archive describe this image and this binary.
dir="$(dirname "$archive")"
python3 - "$work/layout" "$dir" "$work/rootfs$entrypoint" <<'PY' || die "the SBOMs do not describe this image"
import hashlib, json, sys
layout, out, binary = sys.argv[1:]
[desc] = json.load(open(f"{layout}/index.json"))["manifests"]
digest = desc["digest"].split(":", 1)[1]
image = json.load(open(f"{out}/hcp-fleet-agent.oci.cdx.json"))
binary_bom = json.load(open(f"{out}/hcp-fleet-agent.bin.cdx.json"))
sha = hashlib.sha256(open(binary, "rb").read()).hexdigest()
assert image["metadata"]["component"]["hashes"][0]["content"] == digest, "image SBOM names another image"
for bom in (image, binary_bom):
    assert bom["bomFormat"] == "CycloneDX"
    # The binary's component (the cli crate's) carries its path in the image and its hash.
    named = [
        c for c in [bom["metadata"]["component"]] + bom["components"]
        if {"name": "hcp-fleet:path", "value": "/usr/bin/hcp-fleet-agent"} in c.get("properties", [])
    ]
    assert named, "no component of the SBOM is /usr/bin/hcp-fleet-agent"
    assert any(h["content"] == sha for c in named for h in c.get("hashes", [])), "SBOM names another binary"
print(f"[image-check] SBOMs: {len(binary_bom['components'])} crates, image {desc['digest']}", file=sys.stderr)
PY
say "ok: $image"
