"""Every module of ``guard`` imports on its own, and the package has no import cycle.

Two checks:

- each module is imported alone, with no other module of guard imported before it (in a child
  forked from a fresh interpreter that imported none, two at a time): a module that imports only
  when something else was imported first fails here, with its error;
- the import graph, read from the sources with :mod:`ast`, has no cycle. An edge is a
  module-level import (imports inside functions are lazy on purpose, and those under
  ``if TYPE_CHECKING:`` never run), so the order modules are first imported in never matters.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "guard"

# Importing ``__main__`` runs the program (``python -m guard.cli``): never imported alone.
_NOT_IMPORTED_ALONE = ("__main__",)
_WORKERS = 2  # the machines running the suite have two cores
_TIMEOUT_S = 120  # one module's import
_EXT_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def _name(path: Path) -> str | None:
    """The module name of a source file or a built extension under ``guard/``, else None."""
    rel = path.relative_to(ROOT)
    if path.suffix == ".py":
        stem = path.stem
    else:
        suffix = next((s for s in _EXT_SUFFIXES if path.name.endswith(s)), None)
        if suffix is None:
            return None
        stem = path.name[: -len(suffix)]
        if "." in stem:  # another Python's build (nox builds 3.12's and 3.13's in place)
            return None
    parts = [*rel.parts[:-1], stem]
    # a module of a folder without __init__.py (none today) is not part of the package
    for depth in range(1, len(parts)):
        if not (ROOT.joinpath(*parts[:depth]) / "__init__.py").is_file():
            return None
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every module of ``guard`` (packages, sources, the extensions that are built) -> file."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        name = _name(path)
        if name is not None:
            found.setdefault(name, path)  # a source next to an extension (none): the source
    return found


# ------------------------------------------------------------------------- import each alone
#
# A fresh interpreter per module costs ~0.4 s of CPU (importing grpc, protobuf, OpenTelemetry,
# the integrations' libraries, and compiling guard's sources again where PYTHONDONTWRITEBYTECODE
# is set), ~180 modules over two minutes on a loaded two-core machine. So one fresh interpreter
# (the zygote) imports the third-party modules that guard's modules import at module level,
# none of guard's, compiles guard's bytecode into a temporary folder, and forks a child per
# module, two at a time: each child starts with no module of guard loaded, as a fresh
# interpreter would, so no earlier import can hide a failure. (What the preloaded libraries
# import is no question of guard's import order.) Where the zygote cannot fork safely (no fork;
# threads after the preload), each module gets a fresh interpreter of its own instead.

_ZYGOTE = textwrap.dedent(
    """
    import importlib, json, os, sys, time, traceback

    package, pycache, preload, names, workers, timeout = json.loads(sys.stdin.read())
    for module in preload:
        try:
            importlib.import_module(module)
        except BaseException:  # an optional library, or an attribute (from x import y)
            pass
    # guard's bytecode, once, into a temporary folder (the checkout is left as it is): each
    # child reads it rather than compiling the sources again
    import compileall
    sys.pycache_prefix, sys.dont_write_bytecode = pycache, False
    compileall.compile_dir(package, quiet=2, workers=1)
    leaked = sorted(m for m in sys.modules if m == "guard" or m.startswith("guard."))
    if leaked:
        raise SystemExit("the preload imported guard modules: " + ", ".join(leaked))
    tasks = "/proc/self/task"
    threads = len(os.listdir(tasks)) if os.path.isdir(tasks) else 0
    if not hasattr(os, "fork") or threads != 1:
        print(json.dumps({"unsafe": f"fork: {hasattr(os, 'fork')}, threads: {threads}"}))
        raise SystemExit(0)

    results, running = {}, {}  # running: pid -> (name, pipe, started)
    LIMIT = 32_000  # a traceback fits in the pipe: the child never blocks writing it

    def collect():  # a child that has ended, if one has
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return False
        name, pipe, _ = running.pop(pid)
        with os.fdopen(pipe, "rb") as f:
            error = f.read().decode(errors="replace")
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not error:
            error = f"exit status {code}"
        results[name] = error or None
        return True

    queue = list(names)
    while queue or running:
        if queue and len(running) < workers:
            name = queue.pop(0)
            read, write = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: import one module, report, exit without cleanup
                os.close(read)
                os.dup2(2, 1)  # what a module prints stays off the results
                try:
                    importlib.import_module(name)
                    error = ""
                except BaseException:
                    error = traceback.format_exc()[-LIMIT:]
                os.write(write, error.encode(errors="replace")[-LIMIT:])
                os._exit(0)
            os.close(write)
            running[pid] = (name, read, time.monotonic())
            continue
        if not collect():
            for pid, (name, pipe, started) in list(running.items()):
                if time.monotonic() - started > timeout:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    os.close(pipe)
                    running.pop(pid)
                    results[name] = f"timed out after {timeout} s"
            time.sleep(0.005)
    print(json.dumps({"results": results}))
    """
)


def _third_party_imports(modules: dict[str, Path]) -> list[str]:
    """The modules outside guard that guard's modules import at module level (for ``from x
    import y``: ``x``, and ``x.y`` in case it is a module)."""
    found: set[str] = set()
    for path in modules.values():
        for node in _import_nodes(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif node.level == 0 and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return sorted(m for m in found if m.split(".")[0] not in ("guard", "__future__"))


def _error_line(traceback: str) -> str:
    """The exception line of a traceback and the last frame it names."""
    lines = [line for line in traceback.splitlines() if line.strip()]
    where = [line.strip() for line in lines if line.lstrip().startswith('File "')]
    error = lines[-1] if lines else "no output"
    return f"{error}  [{where[-1]}]" if where else error


def _import_alone(name: str) -> str | None:
    """Import ``name`` in a fresh interpreter of its own: its error, or None."""
    proc = subprocess.run(
        [sys.executable, "-c", "import importlib, sys; importlib.import_module(sys.argv[1])", name],
        cwd=ROOT,  # the checkout's guard/ comes first on sys.path ('' for -c)
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )
    if proc.returncode == 0:
        return None
    return _error_line(proc.stderr) if proc.stderr.strip() else f"exit status {proc.returncode}"


def _import_each_alone(
    names: list[str], preload: list[str], pycache: Path
) -> dict[str, str | None]:
    """Each of ``names`` imported with no module of guard loaded before: name -> error.
    ``pycache``: a folder for the bytecode of this run."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # numpy's pool
    proc = subprocess.run(
        [sys.executable, "-c", _ZYGOTE],
        cwd=ROOT,  # the checkout's guard/ comes first on sys.path ('' for -c)
        input=json.dumps([str(PACKAGE), str(pycache), preload, names, _WORKERS, _TIMEOUT_S]),
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S * (1 + len(names) // _WORKERS),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    answer = json.loads(proc.stdout.splitlines()[-1])
    if "results" in answer:
        return {name: error and _error_line(error) for name, error in answer["results"].items()}
    print(f"the zygote cannot fork ({answer['unsafe']}): a fresh interpreter per module")
    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        return dict(zip(names, pool.map(_import_alone, names), strict=True))


def test_every_module_imports_alone(tmp_path: Path) -> None:
    modules = _modules()
    names = [n for n in modules if n.rsplit(".", 1)[-1] not in _NOT_IMPORTED_ALONE]
    assert len(names) > 100, names  # the walk found the package
    preload = _third_party_imports({n: p for n, p in modules.items() if p.suffix == ".py"})
    errors = _import_each_alone(names, preload, tmp_path / "pycache")
    assert sorted(errors) == sorted(names)
    failed = {name: error for name, error in errors.items() if error is not None}
    assert not failed, f"{len(failed)} of {len(names)} modules fail to import alone:\n" + "\n".join(
        f"  {name}: {error}" for name, error in sorted(failed.items())
    )


# ------------------------------------------------------------------------------ import graph


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: at module level, in class bodies and
    in any if/try/with/loop around them; not in functions, not under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, ()):
                    if isinstance(child, ast.stmt):
                        yield from _import_nodes([child])
                    else:  # except handlers, match cases
                        yield from _import_nodes(child.body)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``guard`` that importing ``name`` imports directly.

    ``import a.b`` and ``from a.b import c`` import the packages ``a`` and ``a.b`` too, except
    the packages ``name`` is itself part of (they are imported before it): so a package's
    submodules importing one another, or the package's ``__init__`` importing them, is no
    cycle; a submodule taking a name (not a submodule) from its package's ``__init__`` is an
    edge to it.
    """
    is_package = path.name.startswith("__init__.")
    package = name if is_package else name.rpartition(".")[0]
    own = {*_ancestors(name), name}
    targets: set[str] = set()

    def add(module: str, *, from_package: bool = False) -> None:
        """An import of ``module`` (and its packages); ``from_package``: a name is taken
        from it, so even one of ``name``'s own packages is an edge."""
        for candidate in [*_ancestors(module), module]:
            if candidate in modules and (
                candidate not in own or (from_package and candidate == module)
            ):
                targets.add(candidate)

    for node in _import_nodes(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
            continue
        if node.level:
            base = package.split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            source = ".".join([*base, node.module] if node.module else base)
            assert source, f"{path}: a relative import beyond the top-level package"
        else:
            source = node.module or ""
        takes_names = False
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if sub in modules:
                add(sub)
            else:
                takes_names = True
        add(source, from_package=takes_names)
    targets.discard(name)
    return targets


def _extensions() -> set[str]:
    """The C extensions pyproject.toml declares, built or not (optional: a checkout without a
    compiler has none): modules of the package, which import nothing of it."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        declared = tomllib.load(f)["tool"]["setuptools"]["ext-modules"]
    return {ext["name"] for ext in declared}


def import_graph() -> dict[str, set[str]]:
    """Module of guard -> the modules of guard it imports at module level."""
    sources = {n: p for n, p in _modules().items() if p.suffix == ".py"}
    known = {**dict.fromkeys(_extensions(), ROOT), **sources}
    graph = {name: _imports_of(name, path, known) for name, path in sources.items()}
    return {**{name: set() for name in _extensions()}, **graph}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    return sorted(
        (c for c in strongly_connected(graph) if len(c) > 1 or c[0] in graph[c[0]]),
        key=lambda c: (-len(c), c),
    )


def test_strongly_connected_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert _cycles(graph) == [["a", "b", "c"], ["e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_import_edges(tmp_path: Path) -> None:
    """What counts as an edge, on a made-up package ``p`` (with ``p.q`` and ``p.ext``, say an
    extension, as submodules of ``p``, and ``r`` outside it)."""
    (tmp_path / "a.py").write_text(
        textwrap.dedent(
            """
            from typing import TYPE_CHECKING
            import os
            from . import b, ext
            from .q import name
            import r
            if TYPE_CHECKING:
                from p import typed
            else:
                import p.c
            try:
                from p.d import x
            except ImportError:
                pass
            class K:
                from p import e
            def f():
                from p import lazy
            """
        )
    )
    known = dict.fromkeys(["p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.q", "p.ext", "r"], ROOT)
    # p.a sits in p: importing p.b or p.q is no edge to p (imported before p.a)
    assert _imports_of("p.a", tmp_path / "a.py", known) == {
        *("p.b", "p.c", "p.d", "p.e", "p.ext", "p.q", "r")
    }
    (tmp_path / "deep.py").write_text("from .. import q\nfrom ..q import name\n")
    assert _imports_of("p.sub.deep", tmp_path / "deep.py", {**known, "p.sub": ROOT}) == {"p.q"}
    (tmp_path / "b.py").write_text("from p import helper\nimport r\n")
    assert _imports_of("p.b", tmp_path / "b.py", known) == {"p", "r"}  # a name of p's init
    (tmp_path / "s.py").write_text("from p.q import name\n")
    assert _imports_of("t.s", tmp_path / "s.py", known) == {"p", "p.q"}  # p's init runs too
    (tmp_path / "__init__.py").write_text("from p.a import name\nfrom . import b\n")
    assert _imports_of("p", tmp_path / "__init__.py", known) == {"p.a", "p.b"}


def test_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert {"guard._version", "guard.errors"} <= graph["guard"]  # the walk read the imports
    cycles = _cycles(graph)
    lines = []
    for component in cycles:
        members = set(component)
        lines.append(f"  {len(component)} modules:")
        lines.extend(
            f"    {name} -> {', '.join(sorted(graph[name] & members))}" for name in component
        )
    print("\n".join(lines))
    assert not cycles, (
        f"{len(cycles)} import cycles ({sum(map(len, cycles))} modules); each module with the "
        "modules of its cycle it imports at module level:\n" + "\n".join(lines)
    )
