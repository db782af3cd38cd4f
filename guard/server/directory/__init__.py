"""The run directory: which replica holds each run's stream (Redis, for replicas).

Internal: import what you need from :mod:`guard.server`.
"""
