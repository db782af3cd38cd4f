"""Generated gRPC stubs for the otel-guard wire contract (``proto/guard/v1/guard.proto``).

Regenerate with ``make proto``; ``tests/test_proto_drift.py`` fails when these files drift.
The package lives at ``guard.v1`` because protoc names imports after the proto package.
"""

from guard.v1 import guard_pb2, guard_pb2_grpc

__all__ = ["guard_pb2", "guard_pb2_grpc"]
