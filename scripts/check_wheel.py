"""``make wheel-check``: install what ``make wheel`` built where no C compiler is, and check it.

Two fresh virtualenvs in a temporary folder, each used with a PATH that holds no compiler
(the venv's own ``bin`` and a folder with only ``python``) and ``CC``/``CXX``/``LDSHARED`` set
to ``/bin/false``:

* the manylinux wheel with the ``server`` extra: all four native paths run
  (``guard.native_paths()``), ``otel-guard --version`` answers, and ``otel-guard serve`` starts,
  reports ``native_missing`` 0 in ``GuardAdmin.Stats`` and logs no native-path warning;
* the sdist, built by pip there (``pip wheel``, what ``pip install`` of an sdist runs; a wheel
  of its own, so that pip's cache never hands back a wheel an earlier run built) and installed
  with the ``server`` extra: the build succeeds without the extensions, the pure-Python paths
  run (``native_missing`` 4) and ``serve`` logs the warning.

Prints one JSON line (the result, the wheel's and the sdist's sizes, the timings) and exits
non-zero on any failure.

    python scripts/check_wheel.py [--dist dist] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "otel_guard-"
#: Names of compilers that must not be on the checks' PATH.
COMPILER = re.compile(r"(^|-)(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|tcc)(-[\d.]+)?$")
WARNING = "native fast paths not running"
STATS = """
import json, sys
import grpc
from guard.v1 import guard_pb2, guard_pb2_grpc
with grpc.insecure_channel(sys.argv[1]) as channel:
    stats = guard_pb2_grpc.GuardAdminStub(channel).Stats(guard_pb2.StatsRequest(), timeout=30)
print(json.dumps({k: v for k, v in sorted(stats.figures.items()) if k.startswith("native_")}))
"""
PATHS = "import guard, json; print(json.dumps([guard.__file__, guard.native_paths()]))"


class Failed(Exception):
    """One check did not hold; the message says which and what was seen."""


class Venv:
    """A fresh virtualenv and the compiler-free environment its commands run in."""

    def __init__(self, root: Path, name: str) -> None:
        self.dir = root / name
        subprocess.run([sys.executable, "-m", "venv", str(self.dir)], check=True)
        self.bin = self.dir / "bin"
        self.python = str(self.bin / "python")
        tools = root / f"{name}-tools"  # what the PATH holds besides the venv: python alone
        tools.mkdir()
        for tool in ("python", "python3"):
            (tools / tool).symlink_to(self.python)
        path = os.pathsep.join([str(self.bin), str(tools)])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL"))}
        env.update(PATH=path, CC="/bin/false", CXX="/bin/false", LDSHARED="/bin/false")
        env.update(
            PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", VIRTUAL_ENV=str(self.dir)
        )
        self.env = env
        self.cwd = str(root)  # away from the source tree, whose guard/ would shadow the install
        if found := compilers(path):
            raise Failed(f"a compiler is on the check's PATH: {found}")

    def run(self, *cmd: str, timeout: float = 900) -> str:
        """Run ``cmd`` in the venv's environment; its stdout, or :class:`Failed` with its output."""
        out = subprocess.run(
            cmd, env=self.env, cwd=self.cwd, text=True, capture_output=True, timeout=timeout
        )
        if out.returncode != 0:
            tail = "\n".join((out.stdout + out.stderr).splitlines()[-40:])
            raise Failed(f"{' '.join(cmd[:4])} ... exited {out.returncode}:\n{tail}")
        return out.stdout

    def pip(self, *args: str) -> str:
        return self.run(self.python, "-m", "pip", "--no-input", *args)

    def install(self, wheel: Path) -> str:
        """Install ``wheel`` with the ``server`` extra (its dependencies from pip's cache when
        there; no bytecode compiled ahead, which took about 40% of the install)."""
        return self.pip("install", "--no-compile", f"{wheel}[server]")


def compilers(path: str) -> list[str]:
    """The compilers on ``path``."""
    found = []
    for folder in path.split(os.pathsep):
        if os.path.isdir(folder):
            found += [os.path.join(folder, n) for n in os.listdir(folder) if COMPILER.search(n)]
    return found


def native_paths(venv: Venv) -> dict[str, bool]:
    """``guard.native_paths()`` in ``venv``, after checking ``guard`` is the installed one."""
    where, paths = json.loads(venv.run(venv.python, "-c", PATHS))
    if not where.startswith(str(venv.dir)):
        raise Failed(f"guard was imported from {where}, not from the venv")
    return paths


def serve(venv: Venv) -> tuple[dict[str, float], list[str]]:
    """Start ``otel-guard serve`` in ``venv``, ask ``GuardAdmin.Stats``, stop it; returns the
    native figures and the native-path warning lines it logged."""
    cmd = [str(venv.bin / "otel-guard"), "serve", "--listen", "127.0.0.1:0", "--no-store"]
    cmd += ["--http-listen", "none", "--json", "--log-level", "WARNING"]
    proc = subprocess.Popen(
        cmd, env=venv.env, cwd=venv.cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        reader.join(90)
        if not first or not first[0]:
            raise Failed(f"otel-guard serve did not start: {''.join(stderr)[-2000:]}")
        address = json.loads(first[0])["address"]
        figures = json.loads(venv.run(venv.python, "-c", STATS, address, timeout=60))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        drain.join(10)
        proc.stdout.close()  # type: ignore[union-attr]
    return figures, [line.strip() for line in stderr if WARNING in line]


def check_wheel(root: Path, wheel: Path, version: str, out: dict[str, object]) -> None:
    """The binary wheel: every native path, the CLI, and serve without a warning."""
    started = time.monotonic()
    venv = Venv(root, "wheel-venv")
    venv.install(wheel)
    out["seconds_wheel_install"] = round(time.monotonic() - started, 1)
    paths = out["wheel_native"] = native_paths(venv)
    if not all(paths.values()):
        raise Failed(f"the wheel runs pure-Python paths: {paths}")
    said = venv.run(str(venv.bin / "otel-guard"), "--version").strip()
    if said != f"otel-guard {version}":
        raise Failed(f"otel-guard --version said {said!r}, not {version}")
    figures, warnings = serve(venv)
    out["wheel_stats"] = figures
    if figures.get("native_missing") != 0.0 or warnings:
        raise Failed(f"serve from the wheel: figures {figures}, warnings {warnings}")
    out["seconds_wheel"] = round(time.monotonic() - started, 1)


def check_sdist(root: Path, sdist: Path, out: dict[str, object]) -> None:
    """The sdist without a compiler: it installs, runs pure-Python, and serve warns once."""
    started = time.monotonic()
    venv = Venv(root, "sdist-venv")
    built = root / "sdist-wheel"
    # --no-cache-dir: this build must not come from (or go to) pip's cache of built wheels
    venv.pip("wheel", "--no-deps", "--no-cache-dir", "--wheel-dir", str(built), str(sdist))
    (wheel,) = built.glob(PREFIX + "*.whl")
    venv.install(wheel)
    out["seconds_sdist_install"] = round(time.monotonic() - started, 1)
    paths = out["sdist_native"] = native_paths(venv)
    if any(paths.values()):
        raise Failed(f"the sdist built native paths without a compiler: {paths}")
    figures, warnings = serve(venv)
    out["sdist_stats"] = figures
    out["sdist_warning"] = warnings[0].split(": ", 1)[-1] if warnings else None
    if figures.get("native_missing") != 4.0 or len(warnings) != 1:
        raise Failed(f"serve from the sdist: figures {figures}, warnings {warnings}")
    out["seconds_sdist"] = round(time.monotonic() - started, 1)


def one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(PREFIX + pattern))
    if len(found) != 1:
        raise Failed(f"expected one {pattern} in {dist} (run make wheel), found {found}")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="what make wheel built")
    parser.add_argument("--keep", action="store_true", help="keep the temporary venvs")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out: dict[str, object] = {"ok": False}
    root = Path(tempfile.mkdtemp(prefix="otel-guard-wheel-check-"))
    try:
        dist = args.dist.resolve()  # the checks run in the temporary folder
        wheel = one(dist, "*manylinux*.whl")
        sdist = one(dist, "*.tar.gz")
        version = wheel.name.split("-")[1]
        out.update(wheel=wheel.name, wheel_bytes=wheel.stat().st_size)
        out.update(sdist=sdist.name, sdist_bytes=sdist.stat().st_size, version=version)
        check_wheel(root, wheel, version, out)
        check_sdist(root, sdist, out)
        out["ok"] = True
    except (Failed, subprocess.SubprocessError, OSError, ValueError) as exc:
        out["error"] = str(exc)
    finally:
        out["seconds"] = round(time.monotonic() - started, 1)
        if args.keep:
            out["kept"] = str(root)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
