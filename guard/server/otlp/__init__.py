"""The OTLP receivers: TraceService/Export over gRPC and POST /v1/traces over HTTP, and the
bounded, per-tenant fair intake queue between them and the span applier.

Internal: import what you need from :mod:`guard.server`.
"""
