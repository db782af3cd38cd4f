"""A container runtime for the image tests, made of buildah, unshare and chroot.

There is no Docker daemon where these tests run, so the image is run the way a runtime runs
it, from its own configuration: ``buildah from`` + ``buildah mount`` give the root file
system; each process gets its own PID namespace (the guard is PID 1, as in a pod) and mount
namespace, in which the root file system is read-only (the Helm chart's
``readOnlyRootFilesystem``) but for the volumes given and a tmpfs on /tmp; it runs as the
image's user, in its working directory, with its environment and HOME, and its entrypoint and
command unless told otherwise. The network is the host's (so a test on the host reaches the
guard on 127.0.0.1), or a namespace of its own with only a loopback interface (``net=True``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Image", "Process"]

# Runs on the host inside the new namespaces: mounts, then execs the image's process (chroot,
# then env for the working directory, both exec: the image's process keeps PID 1).
_SETUP = r"""
set -eu
root=$1 user=$2 workdir=$3 net=$4
shift 4
mount --bind "$root" "$root"
while [ "$1" != -- ]; do
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  if [ "$3" = ro ]; then mount -o remount,bind,ro "$root$2"; fi
  shift 3
done
shift
mount -t tmpfs -o mode=1777,size=256m tmpfs "$root/tmp"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount -t proc proc "$root/proc"
mount -o remount,bind,ro "$root"
if [ "$net" = 1 ]; then ip link set lo up; fi
exec chroot --userspec="$user" "$root" /usr/bin/env --chdir="$workdir" "$@"
"""


def buildah(*args: str, timeout: float = 300) -> str:
    """Run buildah (``STORAGE_DRIVER``, when set, as its storage driver); return its stdout."""
    driver = os.environ.get("STORAGE_DRIVER")
    cmd = ["buildah", *(["--storage-driver", driver] if driver else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


class Process:
    """A process of the image, started by :meth:`Image.spawn`."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen

    @property
    def pid(self) -> int:
        """The host PID of the image's process (PID 1 in its own namespace)."""
        deadline = time.monotonic() + 10
        path = Path(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children")
        while time.monotonic() < deadline:
            children = path.read_text().split() if path.exists() else []
            if children:
                return int(children[0])
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("the image's process did not start")

    def namespace_pid(self) -> int:
        """The process's PID as it sees it (its namespace's ``NSpid``, the last one)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
        raise RuntimeError("no NSpid")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Signal the image's process from outside its namespace, as a runtime's stop does
        (PID 1 gets a signal only when it handles it)."""
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> tuple[int, str, str]:
        out, err = self.popen.communicate(timeout=timeout)
        return self.popen.returncode, out, err

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)  # the namespace ends with its PID 1
            except (RuntimeError, ProcessLookupError):
                self.popen.kill()
            self.popen.communicate(timeout=30)


class Image:
    """A working container of ``ref``: its root file system and its configuration."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.config: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", ref))[
            "Docker"
        ]["config"]
        name = f"otel-guard-image-test-{uuid.uuid4().hex[:8]}"
        self.container = buildah("from", "--pull=never", "--name", name, ref).strip()
        self.root = Path(buildah("mount", self.container).strip())

    def close(self) -> None:
        buildah("umount", self.container)
        buildah("rm", self.container)

    def user(self) -> tuple[int, int]:
        """The image's ``USER`` as numbers (a name is looked up in its /etc/passwd)."""
        user, _, group = (self.config.get("User") or "0").partition(":")
        if not user.isdigit():
            for line in (self.root / "etc/passwd").read_text().splitlines():
                fields = line.split(":")
                if fields[0] == user:
                    user, group = fields[2], group or fields[3]
        return int(user), int(group or user)

    def home(self, uid: int) -> str:
        for line in (self.root / "etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if len(fields) > 5 and fields[2] == str(uid):
                return fields[5]
        return "/"

    def spawn(
        self,
        args: Sequence[str] | None = None,
        *,
        entrypoint: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        volumes: Sequence[tuple[str | Path, str, str]] = (),
        net: bool = False,
        join: Process | None = None,
    ) -> Process:
        """Start a process of the image: ``entrypoint`` (default the image's) with ``args``
        (default its command); ``volumes`` are (host path, container path, "rw"|"ro");
        ``join`` runs it in that process's network namespace (a health check's view)."""
        uid, gid = self.user()
        entry = list(self.config.get("Entrypoint") or []) if entrypoint is None else entrypoint
        argv = [*entry, *(self.config.get("Cmd") or [] if args is None else args)]
        environ = dict(e.split("=", 1) for e in self.config.get("Env") or [])
        environ.setdefault("HOME", self.home(uid))
        environ.update(env or {})
        # the host tools this runtime calls (mount, chroot, ip) by their host paths
        environ["PATH"] = environ.get("PATH") or "/usr/sbin:/usr/bin:/sbin:/bin"
        binds: list[str] = []
        for host, inside, mode in volumes:
            binds += [str(host), inside, mode]
        workdir = self.config.get("WorkingDir") or "/"
        cmd = ["unshare", "--pid", "--fork", "--mount", "--propagation", "private"]
        cmd += ["--net"] if net else []
        if join is not None:
            cmd = ["nsenter", f"--net=/proc/{join.pid}/ns/net", *cmd]
        cmd += ["sh", "-c", _SETUP, "setup", str(self.root), f"{uid}:{gid}", workdir]
        cmd += ["1" if net else "0", *binds, "--", *argv]
        popen = subprocess.Popen(
            cmd,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return Process(popen)

    def run(self, args: Sequence[str], *, timeout: float = 120, **kw: Any) -> tuple[int, str, str]:
        """Run ``args`` (after the image's entrypoint unless ``entrypoint=`` says otherwise)
        to completion: (exit status, stdout, stderr)."""
        proc = self.spawn(args, **kw)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise

    def healthcheck(self, *, timeout: float = 60, **kw: Any) -> tuple[int, str, str]:
        """The image's HEALTHCHECK command, as the runtime runs it (``CMD`` form: no shell)."""
        test = list(self.config["Healthcheck"]["Test"])
        assert test[0] == "CMD", test
        return self.run(test[1:], entrypoint=[], timeout=timeout, **kw)
