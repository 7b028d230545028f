#!/usr/bin/env python3
"""The inputs of the image's binary, as one SHA-256: what hack/image.sh's reproduce step keys
its record (hack/image-reproduced.txt) by.

    hack/image-inputs.py DEPINFO CARGO_HOME DESCRIPTION [LIST]

DEPINFO is the dep-info file cargo wrote beside the binary (`<binary>.d`): every source file
the compile read, the workspace's and the registry's. The fingerprint covers

- DESCRIPTION: the build's command line as hack/image.sh runs it (target, features, flags),
  the checkout's and CARGO_HOME's paths in it written as below;
- the toolchain: `rustc -vV`, and what the C parts and the static link read from the system
  (ring's C and assembly through gcc, glibc's static archives, the linker): the Debian
  packages' versions, or the tools' own `--version` where dpkg is absent;
- Cargo.lock, rust-toolchain.toml and every Cargo.toml of the checkout (profiles, features);
- each file of the checkout the compile read, by its path in the checkout and its bytes;
- each registry file the dep-info names, by its path under CARGO_HOME (cargo names the
  workspace's files only today; the registry's bytes are pinned by Cargo.lock's checksums);
- the environment variables the compile read (`# env-dep:` lines), and those cargo, rustc and
  the C compiler of build scripts take their settings from (CARGO_BUILD_*, CARGO_PROFILE_*,
  CARGO_TARGET_*, RUSTFLAGS, RUSTC and its wrappers, CC, CFLAGS, LD and their per-target
  forms), with the checkout's and CARGO_HOME's
  paths written as the build's --remap-path-prefix writes them (a target directory outside the
  checkout keeps its absolute path, and with it its own fingerprint: its paths are not
  remapped).

Two builds with one fingerprint compiled the same inputs, wherever the checkout and CARGO_HOME
are: if their binaries differ, the build is not reproducible. A pass is never wrong (this
compile gave the recorded bytes); an input left out could make a record look current for
changed inputs and fail a reproducible build, so the list errs on the side of too much (a
record made stale by an unrelated change costs a second compile).
It prints the fingerprint; LIST, if given, is written with what went in, one line each (two
machines' lists, diffed, say why their fingerprints differ).
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def command_output(args):
    """What a tool says of itself, or a line saying it is absent (absence is an input too)."""
    if shutil.which(args[0]) is None:
        return f"{args[0]}: absent"
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).strip()


def toolchain():
    lines = [command_output(["rustc", "-vV"])]
    packages = ["gcc", "gcc-12", "cpp-12", "libc6-dev", "libc6", "binutils", "libgcc-12-dev"]
    if shutil.which("dpkg-query"):
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${Package} ${Version}\n", *packages],
            capture_output=True,
            text=True,
            check=False,
        )
        lines.append(done.stdout.strip())
    else:
        lines += [command_output(["cc", "--version"]), command_output(["ld", "--version"])]
    return lines


def tracked_manifests(root):
    """Every Cargo.toml of the checkout: git's list where there is one (a test's throwaway
    crate or a target directory is not the project's), else every one outside target/."""
    if shutil.which("git"):
        done = subprocess.run(
            ["git", "ls-files", "-z", "--", "Cargo.toml", "**/Cargo.toml"],
            cwd=root,
            capture_output=True,
            check=False,
        )
        if done.returncode == 0 and done.stdout:
            return [root / p.decode() for p in done.stdout.split(b"\0") if p]
    return [p for p in root.rglob("Cargo.toml") if "target" not in p.relative_to(root).parts]


def unescape(path):
    # Make's escaping in dep-info: a space is "\ ".
    return path.replace("\\ ", " ")


def depinfo_entries(text):
    """The files and env-dep lines of a cargo dep-info file."""
    files, envs = [], []
    for line in text.splitlines():
        if line.startswith("# env-dep:"):
            envs.append(line[len("# env-dep:"):])
            continue
        if not line.strip() or line.startswith("#") or ":" not in line:
            continue
        _, deps = line.split(":", 1)
        # Paths are separated by spaces that are not escaped.
        files += [unescape(p) for p in re.split(r"(?<!\\) ", deps.strip()) if p]
    return files, envs


def main(argv):
    if len(argv) not in (4, 5):
        sys.stderr.write(__doc__)
        return 2
    depinfo, cargo_home, description = Path(argv[1]), Path(argv[2]).resolve(), argv[3]
    root = Path.cwd().resolve()
    if not depinfo.is_file():
        sys.stderr.write(f"image-inputs: no dep-info file at {depinfo}\n")
        return 1
    files, envs = depinfo_entries(depinfo.read_text())
    if not files:
        sys.stderr.write(f"image-inputs: {depinfo} names no source file\n")
        return 1

    def portable(text):
        # As the build's --remap-path-prefix writes them.
        return text.replace(str(root), "/src").replace(str(cargo_home), "/cargo")

    items = [f"build {portable(description)}"] + [f"toolchain {line}" for line in toolchain()]
    manifests = sorted(tracked_manifests(root))
    fixed = [root / "Cargo.lock", root / "rust-toolchain.toml", *manifests]
    seen = set()
    local, registry = [], []
    for f in [*fixed, *(Path(p) for p in files)]:
        path = f if f.is_absolute() else (root / f)
        path = Path(os.path.normpath(path))
        if path in seen:
            continue
        seen.add(path)
        if path.is_relative_to(root):
            local.append(path)
        elif path.is_relative_to(cargo_home):
            registry.append(path)
        else:
            sys.stderr.write(f"image-inputs: {path} is neither in the checkout nor in CARGO_HOME\n")
            return 1
    for path in sorted(local):
        if not path.exists() and path in fixed:
            items.append(f"file /src/{path.relative_to(root)} absent")
            continue
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as e:
            sys.stderr.write(f"image-inputs: cannot read {path}: {e}\n")
            return 1
        items.append(f"file /src/{path.relative_to(root)} {digest}")
    for path in sorted(registry):
        items.append(f"registry /cargo/{path.relative_to(cargo_home)}")
    # Only what changes the compile's output: RUST_BACKTRACE, CARGO_TERM_COLOR or RUSTUP_*
    # differ between machines and change nothing (the toolchain is `rustc -vV` above).
    settings = re.compile(
        r"^(CARGO_(BUILD|PROFILE|TARGET|ENCODED|UNSTABLE|INCREMENTAL)[A-Z0-9_]*"
        r"|RUSTFLAGS|RUSTC|RUSTC_WRAPPER|RUSTC_WORKSPACE_WRAPPER|RUSTC_BOOTSTRAP"
        r"|(TARGET|HOST)_(CC|CXX|AR|CFLAGS|CXXFLAGS)|CRATE_CC_NO_DEFAULTS"
        r"|(CC|CXX|AR|LD|CFLAGS|CXXFLAGS|CPPFLAGS|LDFLAGS)(_[a-z0-9_]+)?)$"
    )
    for name in sorted(os.environ):
        if settings.match(name):
            envs.append(f"{name}={os.environ[name]} (environment)")
    for env in sorted(envs):
        items.append("env " + portable(env))

    text = "\n".join(items)
    if len(argv) == 5:
        Path(argv[4]).write_text(text + "\n")
    print(hashlib.sha256(text.encode()).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
