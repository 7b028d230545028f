#!/usr/bin/env python3
"""Checks cargo-cyclonedx's SBOM of the image's binary against Cargo.lock and what the build
resolves, then writes the binary's and the image's SBOMs (hack/sbom.sh calls it).

    sbom-check.py CDX.json BINARY-CRATES.txt Cargo.lock BINARY IMAGE-REF IMAGE-DIGEST EPOCH OUT-DIR

Fails, saying which, unless:
- every crate the binary's build resolves (BINARY-CRATES.txt, from `cargo tree`) is listed
  with its exact version, a `pkg:cargo` package URL and Cargo.lock's SHA-256 checksum;
- every crate listed is in Cargo.lock at that version (cargo-cyclonedx reads cargo metadata,
  which unifies features over every target kind, so it may list a few crates the build does
  not compile: they are named, and marked excluded);
- every crate of Cargo.lock is listed: those the binary does not contain (tests, benches, the
  test bed, other platforms) in CycloneDX's "excluded" scope.
"""

import datetime
import hashlib
import json
import os
import sys
import tomllib
import uuid


def fail(msg):
    sys.exit(f"[sbom] error: {msg}")


def main():
    if len(sys.argv) != 9:
        fail("usage: sbom-check.py CDX.json BINARY-CRATES.txt Cargo.lock BINARY IMAGE-REF IMAGE-DIGEST EPOCH OUT-DIR")
    cdx_path, crates_path, lock_path, binary, ref, digest, epoch, out = sys.argv[1:]
    # The checkout's path, which cargo-cyclonedx writes into the project's own references, is
    # not part of what was built: every clone writes the same SBOM.
    repo = os.path.dirname(os.path.abspath(lock_path))
    cdx = json.loads(open(cdx_path).read().replace(f"path+file://{repo}", "path+file:///src"))
    lock = {(p["name"], p["version"]): p.get("checksum") for p in tomllib.load(open(lock_path, "rb"))["package"]}
    root = cdx["metadata"]["component"]
    resolved = set()
    for line in open(crates_path):
        words = line.split()
        if len(words) >= 2 and words[1].startswith("v"):
            resolved.add((words[0], words[1][1:]))
    resolved.discard((root["name"], root["version"]))
    if not resolved:
        fail("cargo tree resolved no crates for the binary")

    listed = {}
    for c in cdx.get("components", []):
        key = (c.get("name"), c.get("version"))
        if key not in lock:
            fail(f"{key[0]} {key[1]} is in the SBOM but not in Cargo.lock")
        if not str(c.get("purl", "")).startswith(f"pkg:cargo/{key[0]}@{key[1]}"):
            fail(f"{key[0]} {key[1]}: package URL {c.get('purl')!r}")
        sha = {h.get("alg"): h.get("content") for h in c.get("hashes", [])}.get("SHA-256")
        if lock[key] and sha != lock[key]:
            fail(f"{key[0]} {key[1]}: SHA-256 {sha!r}, Cargo.lock has {lock[key]!r}")
        listed[key] = c
    missing = sorted(resolved - listed.keys())
    if missing:
        fail(f"{len(missing)} crates the binary is built from are not in the SBOM: {missing[:10]}")
    # cargo metadata, which cargo-cyclonedx reads, unifies features over every target kind,
    # so it may list a crate that cargo's resolver leaves out of this build (ring in the FIPS
    # variant's, say): such a crate is not in the binary, and is marked excluded below.
    extra = sorted(listed.keys() - resolved)
    for key in extra:
        listed[key]["scope"] = "excluded"
    not_in_binary = sorted(set(lock) - listed.keys() - {(root["name"], root["version"])})
    # Listed too, as CycloneDX's "excluded" scope (used for tests and other non-runtime
    # purposes): the SBOM accounts for every crate of Cargo.lock.
    excluded = [
        {
            "type": "library",
            # A crate without a checksum is one of the workspace's own (the test bed, e2e).
            "bom-ref": (
                f"registry+https://github.com/rust-lang/crates.io-index#{name}@{version}"
                if lock[(name, version)]
                else f"path+file:///src#{name}@{version}"
            ),
            "name": name,
            "version": version,
            "scope": "excluded",
            "purl": f"pkg:cargo/{name}@{version}",
            **({"hashes": [{"alg": "SHA-256", "content": lock[(name, version)]}]} if lock[(name, version)] else {}),
        }
        for name, version in not_in_binary
    ]
    cdx["components"] = list(listed.values()) + excluded

    created = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    binary_sha = hashlib.sha256(open(binary, "rb").read()).hexdigest()

    def stamp(bom, name):
        # Numbered from the image's digest and dated by the commit: one commit, one SBOM.
        bom["serialNumber"] = "urn:uuid:" + str(uuid.UUID(hashlib.sha256(f"{digest}/{name}".encode()).hexdigest()[:32]))
        bom["metadata"]["timestamp"] = created
        return bom

    root.setdefault("hashes", [])
    root["hashes"] = [{"alg": "SHA-256", "content": binary_sha}]
    root.setdefault("properties", []).append({"name": "hcp-fleet:path", "value": "/usr/bin/hcp-fleet-agent"})
    binary_bom = stamp(cdx, "binary")
    with open(f"{out}/hcp-fleet-agent.bin.cdx.json", "w") as f:
        json.dump(binary_bom, f, indent=2, sort_keys=True)

    repository, _, version = ref.rpartition(":")
    image_ref = f"image:{repository}@{digest}"
    image = {
        "bomFormat": "CycloneDX",
        "specVersion": cdx.get("specVersion", "1.5"),
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "bom-ref": image_ref,
                "name": repository,
                "version": version,
                "hashes": [{"alg": "SHA-256", "content": digest.split(":", 1)[1]}],
                "purl": f"pkg:oci/{repository.rsplit('/', 1)[-1]}@{digest.replace(':', '%3A')}?repository_url={repository}",
            },
            "tools": cdx["metadata"].get("tools", []),
        },
        "components": [dict(root, type="application")] + cdx["components"],
        "dependencies": [{"ref": image_ref, "dependsOn": [root["bom-ref"]]}] + cdx.get("dependencies", []),
    }
    with open(f"{out}/hcp-fleet-agent.oci.cdx.json", "w") as f:
        json.dump(stamp(image, "image"), f, indent=2, sort_keys=True)
    print(
        f"[sbom] {len(resolved)} crates the binary is built from, each listed with its version, checksum and "
        f"package URL; {len(not_in_binary)} more of Cargo.lock listed as excluded (tests, benches, the test bed, "
        f"other platforms)" + (f"; listed by cargo metadata's wider features though not built, so marked excluded: {', '.join(n for n, _ in extra)}" if extra else ""),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
