#!/usr/bin/env bash
# The coordinator's runtime image (deploy/docker/coordinator.Dockerfile, its
# last stage, on debian:12-slim) must install the Debian package of every
# shared library the binary links, or the container fails at every start
# ("error while loading shared libraries": it lacked libsqlite3-0 once).
# The worker's image copies the libraries it links instead (its ldd step).
#   bash scripts/check_image_libraries.sh
# Builds the coordinator in the default configuration, then maps each
# library `ldd` lists to its package (dpkg -S on the real file); the
# packages the runtime stage installs, with their dependencies (apt-cache
# depends --recurse, no recommends), and what debian:12-slim already has
# (this machine's Essential and Priority: required packages, and apt, with
# theirs) must cover them all. Needs package lists (scripts/setup.sh runs
# apt-get update); no network and no Docker.
# Prints each library that nothing installs (and a Dockerfile that runs
# scripts/setup.sh beyond the build), then "image libraries: N missing";
# exits 1 when one is.
set -uo pipefail
cd "$(dirname "$0")/.."
bazel build //coordinator:pipetrain-coordinator >/dev/null 2>&1 ||
  { echo "image libraries: cannot build the coordinator"; exit 1; }
# (Bazel 4 has no --output=files.) A path under bazel-out, not bazel-bin,
# which points at the last configuration built.
binary=$(bazel cquery //coordinator:pipetrain-coordinator --output=starlark \
  --starlark:expr='target.files.to_list()[0].path' 2>/dev/null)
export binary

python3 - <<'PY'
import os
import re
import subprocess
import sys


def run(*args):
    return subprocess.run(args, capture_output=True, text=True, check=False).stdout


def closure(packages):
    """The packages and everything they depend on (not recommends)."""
    if not packages:
        return set()
    out = run("apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
              "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages)
    names = set()
    for line in out.splitlines():
        line = line.strip()
        if line.startswith(("Depends:", "PreDepends:", "|Depends:", "|PreDepends:")):
            line = line.split(":", 1)[1].strip()
        name = line.strip("<>").split(":")[0]
        if name:
            names.add(name)
    return names | set(packages)


def runtime_packages(dockerfile):
    """The packages `apt-get install` names in the file's last stage."""
    text = open(dockerfile).read()
    last_stage = re.split(r"(?m)^FROM ", text)[-1]
    packages = set()
    for command in re.findall(r"apt-get install([^&]*)", last_stage):
        for word in command.replace("\\\n", " ").split():
            if not word.startswith("-"):
                packages.add(word)
    return packages


def library_packages(binary):
    """{library path: its package} for every library the binary links."""
    found = {}
    for line in run("ldd", binary).splitlines():
        match = re.search(r"=> (/\S+)", line) or re.match(r"\s*(/\S+)", line)
        if not match:
            continue
        path = match.group(1)
        real = os.path.realpath(path)  # through alternatives (libopenblas.so.0)
        owner = ""
        for candidate in (real, real.replace("/usr/lib/", "/lib/", 1), path,
                          path.replace("/lib/", "/usr/lib/", 1)):
            out = run("dpkg", "-S", candidate)
            if out:
                owner = out.split(":")[0]
                break
        found[path] = owner
    return found


base_out = run("dpkg-query", "-W", "-f=${Package} ${Essential} ${Priority}\\n")
base = {p.split()[0] for p in base_out.splitlines()
        if p.split()[1:2] == ["yes"] or p.endswith(" required")}
base = closure(sorted(base | {"apt"}))

missing = 0
for dockerfile, binary in [("deploy/docker/coordinator.Dockerfile", os.environ["binary"])]:
    installed = closure(sorted(runtime_packages(dockerfile))) | base
    libraries = library_packages(binary)
    if not libraries:
        print(f"{binary}: ldd listed no libraries; build it first")
        missing += 1
    for path, owner in sorted(libraries.items()):
        if owner not in installed:
            print(f"{dockerfile}: {binary} links {path} "
                  f"({owner or 'no Debian package'}), which the image does not install")
            missing += 1
# Both images' build stages run setup.sh for the build only: its test tools
# and npm packages would need the npm registry, and a build host that
# reaches a Debian mirror alone would fail the image.
for dockerfile in ("deploy/docker/coordinator.Dockerfile", "deploy/docker/worker.Dockerfile"):
    for line in open(dockerfile):
        if "scripts/setup.sh" in line and not line.lstrip().startswith("#") and \
                "PIPETRAIN_SETUP_BUILD_ONLY=1" not in line:
            print(f"{dockerfile}: runs scripts/setup.sh without PIPETRAIN_SETUP_BUILD_ONLY=1")
            missing += 1
print(f"image libraries: {missing} missing")
sys.exit(1 if missing else 0)
PY
