"""Which native fast paths run: the C extensions a binary wheel carries, or their pure-Python
references when the install had no C compiler (or ``OTEL_GUARD_PURE_PYTHON=1`` turned them off).

:func:`native_paths` answers for the four paths by name; ``GuardAdmin.Stats`` carries the same
answer as figures (:func:`native_figures`), and ``otel-guard serve`` logs one warning when any
of them is not running (:func:`warn_pure_paths`).
"""

from __future__ import annotations

import logging
import os
from importlib.machinery import ExtensionFileLoader, PathFinder

__all__ = ["NATIVE_PATHS", "native_built", "native_figures", "native_paths", "warn_pure_paths"]

#: The native paths by name, each with the extension module that holds it.
NATIVE_PATHS: dict[str, str] = {
    "policy": "guard.policy._speedups",  # fingerprints, loop detection, the record kernels
    "decode": "guard.server.decode._otlpnative",  # OTLP span requests into observations
    "applier": "guard.server.applier._applynative",  # the span path's loop over the observations
    "rows": "guard.store._rowsnative",  # the runs rows' WAL lines
}

#: The fleet load's span ingest without any native path, against a binary wheel's, and how
#: the warning says it (benchmarks/bench_ingest.py --pure-python, ``pure_python_vs_guard``:
#: 0.32 in the median of five trials, since the native span applier).
PURE_INGEST_SPEED = 0.32
PURE_INGEST_WORDS = "about a third of the speed"

_log = logging.getLogger("guard.native")
_warned = False


def _running_policy() -> bool:
    from guard.policy import native_available

    return native_available()


def _running_decode() -> bool:
    from guard.server.decode import _nativedecode

    return _nativedecode.available()


def _running_applier() -> bool:
    from guard.server.applier import _nativeapply

    return _nativeapply.available()


def _running_rows() -> bool:
    from guard.store import _rows

    return _rows.native_available()


_RUNNING = {
    "policy": _running_policy,
    "decode": _running_decode,
    "applier": _running_applier,
    "rows": _running_rows,
}


def native_built() -> dict[str, bool]:
    """Whether each path's extension is built for this interpreter (a file of the package),
    without importing it. The applier also needs the policy's kernels, so it counts as built
    only with them."""
    import guard

    built = {}
    for name, module in NATIVE_PATHS.items():
        package, _, leaf = module.rpartition(".")
        where = [os.path.join(p, *package.split(".")[1:]) for p in guard.__path__]
        spec = PathFinder.find_spec(leaf, where)
        built[name] = spec is not None and isinstance(spec.loader, ExtensionFileLoader)
    built["applier"] = built["applier"] and built["policy"]
    return built


def native_paths() -> dict[str, bool]:
    """Which native fast paths run in this process, by name: ``policy`` (fingerprints, loop
    detection and the policy's record kernels), ``decode`` (the OTLP span decoder),
    ``applier`` (the span path's loop) and ``rows`` (the store's runs rows).

    True: the C extension runs; False: its pure-Python reference does (no C compiler built
    it, or ``OTEL_GUARD_PURE_PYTHON=1``). A binary wheel has all four. In an install without
    the ``server`` extra, whose guard service cannot run, ``decode``, ``applier`` and
    ``rows`` answer whether the extension is built (:func:`native_built`).
    """
    built: dict[str, bool] | None = None
    out = {}
    for name, running in _RUNNING.items():
        try:
            out[name] = running()
        except ImportError:  # a dependency of the server extra is not installed
            built = native_built() if built is None else built
            out[name] = built[name]
    return out


def native_figures() -> dict[str, float]:
    """``GuardAdmin.Stats`` figures: ``native_<path>`` (1: native, 0: the pure-Python
    reference) for each path, and ``native_missing``, how many run pure-Python."""
    paths = native_paths()
    out = {f"native_{name}": float(on) for name, on in paths.items()}
    out["native_missing"] = float(sum(not on for on in paths.values()))
    return out


def pure_paths_message(paths: dict[str, bool], built: dict[str, bool]) -> str | None:
    """The warning for the paths that run pure-Python (``None`` when all four are native):
    which ones and why, what it costs, and what to do about it."""
    missing = [name for name, on in paths.items() if not on]
    if not missing:
        return None
    unbuilt = [name for name in missing if not built[name]]
    off = [name for name in missing if built[name]]
    why = []
    if unbuilt:
        why.append(f"not built: {', '.join(unbuilt)}")
    if off:
        why.append(f"turned off: {', '.join(off)}")
    if len(missing) == len(paths):
        cost = (
            f"span ingest runs at {PURE_INGEST_WORDS} ({PURE_INGEST_SPEED:g}x of a binary wheel's)"
        )
    else:  # the measured figure is for all four; a part of them costs a part of it
        cost = f"span ingest runs slower ({PURE_INGEST_WORDS}, {PURE_INGEST_SPEED:g}x, with none native)"
    fixes = []
    if unbuilt:
        fixes.append("install a binary wheel or build with a C compiler")
    if off:
        fixes.append("unset OTEL_GUARD_PURE_PYTHON")
    return f"native fast paths not running ({'; '.join(why)}): {cost}; {', and '.join(fixes)}"


def warn_pure_paths(logger: logging.Logger | None = None) -> str | None:
    """Log one WARNING, once per process, naming the native paths that are not running and
    what that costs; returns the message, or ``None`` (all native, or already warned)."""
    global _warned
    if _warned:
        return None
    message = pure_paths_message(native_paths(), native_built())
    _warned = True
    if message is not None:
        (logger or _log).warning("%s", message)
    return message
