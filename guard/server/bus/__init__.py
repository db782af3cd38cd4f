"""The directive bus: commands for a run held by another replica (Redis, for replicas).

Internal: import what you need from :mod:`guard.server`.
"""
