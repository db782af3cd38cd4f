"""The checked-in stubs in guard/v1 must match what protoc generates from proto/."""

from __future__ import annotations

from pathlib import Path

import pytest

from guard.v1 import _generate


def test_checked_in_stubs_match_proto(tmp_path: Path) -> None:
    generated = _generate.generate(tmp_path)
    assert generated, "protoc produced no files"
    checked_in = _generate.REPO_ROOT
    for path in generated:
        rel = path.relative_to(tmp_path)
        ours = checked_in / rel
        assert ours.exists(), f"{rel} is generated but not checked in: run `make proto`"
        assert ours.read_bytes() == path.read_bytes(), (
            f"{rel} drifted from proto/: run `make proto`"
        )


def test_drift_is_detected(tmp_path: Path) -> None:
    """The comparison above can fail: a changed proto yields different stubs."""
    proto = tmp_path / "proto" / "guard" / "v1"
    proto.mkdir(parents=True)
    src = (_generate.PROTO_ROOT / "guard" / "v1" / "guard.proto").read_text()
    (proto / "guard.proto").write_text(
        src.replace("uint32 loop_hits = 13;", "uint64 loop_hits = 13;")
    )
    out = tmp_path / "out"
    original_root = _generate.PROTO_ROOT
    try:
        _generate.PROTO_ROOT = tmp_path / "proto"
        changed = {p.relative_to(out): p.read_bytes() for p in _generate.generate(out)}
    finally:
        _generate.PROTO_ROOT = original_root
    rel = Path("guard/v1/guard_pb2.py")
    assert changed[rel] != (_generate.REPO_ROOT / rel).read_bytes()


@pytest.mark.parametrize("service", ["GuardControl", "GuardAdmin"])
def test_services_are_declared(service: str) -> None:
    from guard.v1 import guard_pb2

    assert service in guard_pb2.DESCRIPTOR.services_by_name
