"""otel-guard: OpenTelemetry-native observability and guard sidecar for LLM agents."""

from guard.errors import GuardError, RunStopped

__version__ = "0.1.0"

__all__ = ["GuardError", "RunStopped", "__version__"]
