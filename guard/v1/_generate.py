"""Generate the checked-in stubs from ``proto/`` with grpcio-tools (a dev dependency).

Usage: ``python -m guard.v1._generate [OUT_DIR]``. Without OUT_DIR it writes into the
repository's ``guard/v1`` folder; the drift test passes a temporary folder and compares.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["PROTO_ROOT", "generate"]

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_FILES = ("guard/v1/guard.proto",)


def generate(out_root: Path) -> list[Path]:
    """Run protoc for every proto file; returns the generated files under ``out_root``."""
    from grpc_tools import protoc  # dev-only dependency; imported lazily

    out_root.mkdir(parents=True, exist_ok=True)
    for rel in PROTO_FILES:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            rel,
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc} for {rel}")
    return sorted(p for p in out_root.rglob("*_pb2*.py*") if p.is_file())


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else REPO_ROOT
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
