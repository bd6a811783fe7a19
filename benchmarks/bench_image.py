"""The container image's size and build time, built as tests/deploy/test_image.py builds
it: the shipped Dockerfile with buildah on the test's Debian bookworm base (no registry
is reachable here, so not on python:3.11-slim; the stepscope part of the image is the
same either way: the venv in /opt/stepscope).

Reports the base and the image (buildah's uncompressed size, and gzip-compressed as a
registry stores it), their layers, what /opt/stepscope holds by package, and the build's
wall time (the base made anew with --cold, else the cached one).

Usage (from the repo root, as root or with buildah's rootless set-up)::

    python -m benchmarks.bench_image [--cold]

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support import image as images


def _compressed_mib(name: str, tmp: Path) -> float:
    """Sum of the image's blobs as a registry stores them (gzip layers)."""
    out = tmp / name.rsplit(":", 1)[-1]
    subprocess.run(["buildah", "push", "--quiet", "--compression-format", "gzip", name,
                    f"oci:{out}"], env=images.ENV, check=True, capture_output=True)
    index = json.loads((out / "index.json").read_text())
    digest = index["manifests"][0]["digest"].split(":", 1)[1]
    manifest = json.loads((out / "blobs" / "sha256" / digest).read_text())
    sizes = [layer["size"] for layer in manifest["layers"]]
    return float(sum(sizes)) / 2**20


def _venv_by_package(ctr: str) -> list[tuple[str, float]]:
    script = (
        "import os, sys\n"
        "root = '/opt/stepscope/lib/python3.11/site-packages'\n"
        "for name in sorted(os.listdir(root)):\n"
        "    total = 0\n"
        "    for d, _, files in os.walk(os.path.join(root, name)):\n"
        "        total += sum(os.lstat(os.path.join(d, f)).st_size for f in files)\n"
        "    print(name, total)\n"
    )
    done = images.run_in(ctr, ["python", "-c", script])
    sizes: dict[str, float] = {}
    for line in done.stdout.splitlines():
        name, size = line.rsplit(" ", 1)
        package = name.split("-")[0].split(".")[0].lower()
        sizes[package] = sizes.get(package, 0.0) + int(size) / 2**20
    return sorted(sizes.items(), key=lambda kv: -kv[1])


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", action="store_true",
                        help="make the base anew (drop the cached tarball and image first)")
    args = parser.parse_args()
    if args.cold:
        (images.CACHE / f"base-{images.base_key()}.tar").unlink(missing_ok=True)
        images.remove_image(images.base_name())
    name = "localhost/stepscope-bench:image"
    with tempfile.TemporaryDirectory(prefix="stepscope-image-") as tmp:
        start = time.monotonic()
        built = images.build(name, Path(tmp))
        wall = time.monotonic() - start
        try:
            base = images.inspect(built.base, built.base)
            print("| image | uncompressed | gzip (as pushed) | layers |")
            print("|---|---|---|---|")
            for img in (base, built):
                mib = _compressed_mib(img.name, Path(tmp))
                print(f"| {img.name} | {img.size} | {mib:.1f} MiB | {img.layers} |")
            print(f"\nbuild: {wall:.1f} s ({'base made anew' if args.cold else 'cached base'})\n")
            print("| /opt/stepscope/lib/.../site-packages | MiB |")
            print("|---|---|")
            with images.container(name) as ctr:
                packages = _venv_by_package(ctr)
            for package, mib in packages:
                if mib >= 0.5:
                    print(f"| {package} | {mib:.1f} |")
            print(f"| (all {len(packages)}) | {sum(m for _, m in packages):.1f} |")
        finally:
            images.remove_image(name)


if __name__ == "__main__":
    main()
