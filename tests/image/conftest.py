"""The container image tests: only with ``OTEL_GUARD_IMAGE_TEST=1`` (``make image-test``).

They need root, buildah and a built image (``make image``), and take minutes, so the normal
suite does not collect them at all: a skip would fail a ``CI=true`` run, which allows no
skips. With the variable set nothing is skipped: a missing tool or image fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ENABLED = os.environ.get("OTEL_GUARD_IMAGE_TEST", "") == "1"
collect_ignore_glob = [] if ENABLED else ["test_*.py"]


def image_ref() -> str:
    """``$IMAGE``, else the tag ``make image`` gives: the chart's repository and the version."""
    from guard._version import __version__

    return os.environ.get("IMAGE") or f"ghcr.io/otel-guard/otel-guard:{__version__}"


def _ensure_in_buildah(ref: str) -> None:
    """Built with docker, the image is copied into buildah's storage (the tests' runtime)."""
    from _container import buildah

    try:
        buildah("inspect", "--type", "image", ref)
        return
    except RuntimeError:
        pass
    daemon = shutil.which("docker") is not None and (
        subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    )
    if not daemon:
        pytest.fail(f"no image {ref} in buildah's storage: run `make image` first")
    archive = Path(os.environ.get("TMPDIR", "/var/tmp")) / "otel-guard-image-test.tar"
    try:
        subprocess.run(["docker", "save", "-o", str(archive), ref], check=True, timeout=600)
        pulled = buildah("pull", "-q", f"docker-archive:{archive}", timeout=600)
        buildah("tag", pulled.split()[-1], ref)
    finally:
        archive.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def image() -> Iterator[object]:
    """A working container of the built image (see ``_container.Image``)."""
    if os.geteuid() != 0:
        pytest.fail("the image tests run as root (buildah, mount and chroot namespaces)")
    for tool in ("buildah", "unshare", "nsenter", "chroot", "ip"):
        if shutil.which(tool) is None:
            pytest.fail(f"the image tests need {tool}")
    from _container import Image

    ref = image_ref()
    _ensure_in_buildah(ref)
    img = Image(ref)
    try:
        yield img
    finally:
        img.close()
