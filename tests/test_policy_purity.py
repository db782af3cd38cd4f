"""guard.policy must import with grpc, OpenTelemetry, ClickHouse, chDB and yaml unavailable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = ("grpc", "google.protobuf", "opentelemetry", "clickhouse_connect", "chdb", "yaml")

_SCRIPT = textwrap.dedent(
    """
    import sys

    BLOCKED = {blocked!r}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError("blocked by the purity test: " + name)
            return None

    sys.meta_path.insert(0, Block())
    for b in BLOCKED:
        try:
            __import__(b)
        except ImportError:
            pass
        else:
            raise SystemExit("the blocker failed to block " + b)

    import guard.policy as p
    from guard.policy import Budget, Limits, LoopDetector, PolicyConfig, decide

    # Exercise the engine a little, so lazy imports inside functions are caught too.
    b = Budget(Limits(max_steps=2, max_tokens=100, deadline_s=10))
    b.record_step()
    b.record_model_call(input_tokens=10, output_tokens=5)
    with b.reserve(tokens=5):
        pass
    assert not b.decide().stop
    assert decide(Limits(max_steps=1), b.usage(), elapsed_s=0.0).stop
    det = LoopDetector()
    fp = p.Fingerprinter(b"k")
    for _ in range(3):
        det.observe_action(fp.action("t", {{"a": 1}}), fp.result("r"))
    assert det.nbytes() > 0
    PolicyConfig.from_dict({{"runs": {{"max_steps": 5}}}})
    loaded = sorted(
        m for m in sys.modules if any(m == x or m.startswith(x + ".") for x in BLOCKED)
    )
    assert not loaded, loaded
    print("PURE", len(p.__all__))
    """
)


def test_policy_imports_with_heavy_modules_blocked() -> None:
    script = _SCRIPT.format(blocked=BLOCKED)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("PURE "), proc.stdout
    assert int(proc.stdout.split()[1]) >= 40
