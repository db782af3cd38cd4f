"""Run ``python -m guard.cli ...`` with cProfile switched by signals (``bench_ingest --profile``).

    python benchmarks/_profiled_guard.py OUT_PREFIX -m guard.cli serve ...

SIGUSR1 starts a fresh profile of the main thread (the guard's event loop); SIGUSR2 stops it
and writes it to ``OUT_PREFIX.<n>`` (n = 0, 1, ...), so a benchmark can profile exactly its
timed phases. Profiling slows the guard: a profiled run's figures are not to be quoted.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys


def main() -> None:
    prefix, flag, module, *rest = sys.argv[1:]
    assert flag == "-m", "usage: _profiled_guard.py OUT_PREFIX -m MODULE ARGS..."
    state: dict = {"prof": None, "n": 0}

    def start(signum, frame) -> None:
        state["prof"] = cProfile.Profile()
        state["prof"].enable()

    def stop(signum, frame) -> None:
        prof = state["prof"]
        if prof is not None:
            prof.disable()
            prof.dump_stats(f"{prefix}.{state['n']}")
            state["n"] += 1
            state["prof"] = None

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
