#!/usr/bin/env python3
"""Writes the image of a Containerfile as an OCI image layout archive, byte for byte the same
from the same inputs: hack/image.sh calls it after the static build.

    oci-image.py CONTAINERFILE REF VERSION REVISION EPOCH OUT.tar [BINARY]

BINARY, where given, is what the Containerfile's COPY of the binary takes instead of the path
it names (the FIPS variant is built in a target directory of its own).

Only the instructions a FROM scratch image needs are understood: FROM scratch, COPY (one
source, one destination), USER (numeric), ENTRYPOINT (a JSON array) and LABEL key="value";
anything else is refused rather than ignored. The layer is one tar of the COPY'd files and
their parent directories, owned by 0:0, every date EPOCH (SOURCE_DATE_EPOCH, the commit's
time), in name order, gzipped with no name or date in its header; the config's and history's
creation time is EPOCH too. So the manifest's digest, which names the image, depends on the
Containerfile, the binary and EPOCH alone: two builds of one commit give one digest.

Prints the manifest's digest (sha256:...) on stdout.
"""

import datetime
import gzip
import hashlib
import io
import json
import os
import shlex
import sys
import tarfile

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def die(msg):
    sys.exit(f"[image] error: {msg}")


def parse(path, binary=None):
    """The Containerfile's COPY pairs, user, entrypoint and labels, in file order; `binary`
    replaces the source of the COPY to /usr/bin/hcp-fleet-agent."""
    copies, user, entrypoint, labels = [], None, None, {}
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            instr, _, rest = line.partition(" ")
            rest = rest.strip()
            if instr == "FROM":
                if rest != "scratch":
                    die(f"Containerfile: only FROM scratch is understood, not {rest!r}")
            elif instr == "COPY":
                words = rest.split()
                if len(words) != 2:
                    die("Containerfile: COPY takes one source and one destination")
                if binary and words[1] == "/usr/bin/hcp-fleet-agent":
                    words[0] = binary
                if not os.path.isfile(words[0]):
                    die(f"Containerfile: COPY source {words[0]} does not exist")
                copies.append((words[0], words[1]))
            elif instr == "USER":
                ids = rest.split(":")
                if not all(i.isdigit() for i in ids) or len(ids) > 2:
                    die(f"Containerfile: USER must be numeric, not {rest!r}")
                user = rest
            elif instr == "ENTRYPOINT":
                try:
                    entrypoint = json.loads(rest)
                except json.JSONDecodeError as e:
                    die(f"Containerfile: ENTRYPOINT must be a JSON array: {e}")
                if not (isinstance(entrypoint, list) and all(isinstance(w, str) for w in entrypoint)):
                    die("Containerfile: ENTRYPOINT must be a JSON array of strings")
            elif instr == "LABEL":
                key, sep, value = rest.partition("=")
                if not sep:
                    die(f"Containerfile: LABEL {rest!r} has no value")
                labels[key.strip()] = shlex.split(value)[0] if value.strip() else ""
            else:
                die(f"Containerfile: {instr} is not understood by hack/oci-image.py")
    if not copies:
        die("Containerfile: nothing to COPY")
    return copies, user, entrypoint, labels


def write_tar(fileobj, entries, epoch):
    """A tar of `entries` (name: None for a directory, or (mode, bytes) for a file) in name
    order, owned by 0:0 with no user or group names, every date `epoch`."""
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
            if entries[name] is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.mode, data = entries[name]
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def layer(copies, epoch):
    """The uncompressed layer: the files and every parent directory, dated `epoch`."""
    entries = {}
    for src, dst in copies:
        parts = dst.strip("/").split("/")
        for i in range(1, len(parts)):
            entries.setdefault("/".join(parts[:i]), None)
        with open(src, "rb") as f:
            entries["/".join(parts)] = (0o755, f.read())
    out = io.BytesIO()
    write_tar(out, entries, epoch)
    return out.getvalue()


def gzipped(data):
    out = io.BytesIO()
    # mtime=0 and no file name: the header carries nothing of when or where.
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0, filename="") as z:
        z.write(data)
    return out.getvalue()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def main():
    if len(sys.argv) not in (7, 8):
        die("usage: oci-image.py CONTAINERFILE REF VERSION REVISION EPOCH OUT.tar [BINARY]")
    containerfile, ref, version, revision, epoch, out = sys.argv[1:7]
    binary = sys.argv[7] if len(sys.argv) == 8 else None
    epoch = int(epoch)
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    copies, user, entrypoint, labels = parse(containerfile, binary)
    labels["org.opencontainers.image.version"] = version
    labels["org.opencontainers.image.revision"] = revision
    labels["org.opencontainers.image.created"] = created

    blobs = {}

    def blob(media, data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": digest, "size": len(data)}

    tar = layer(copies, epoch)
    diff_id = "sha256:" + hashlib.sha256(tar).hexdigest()
    config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {k: v for k, v in (("User", user), ("Entrypoint", entrypoint), ("Labels", labels)) if v},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": f"COPY {src} {dst}"} for src, dst in copies],
    }
    layer_desc = blob(MEDIA_LAYER, gzipped(tar))
    config_desc = blob(MEDIA_CONFIG, canonical(config))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc,
        "layers": [layer_desc],
        "annotations": {"org.opencontainers.image.created": created},
    }
    manifest_desc = blob(MEDIA_MANIFEST, canonical(manifest))
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    # The image's full name, where docker, podman and skopeo read it from an OCI archive.
    manifest_desc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [manifest_desc]}

    files = {
        "blobs": None,
        "blobs/sha256": None,
        "oci-layout": (0o644, canonical({"imageLayoutVersion": "1.0.0"})),
        "index.json": (0o644, canonical(index)),
    }
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.split(":", 1)[1]] = (0o644, data)
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        write_tar(f, files, epoch)
    os.replace(tmp, out)
    print(manifest_desc["digest"])


if __name__ == "__main__":
    main()
