"""The run table and the ways into and out of it: admission, per-run state, run ends,
records from the wire and re-registration after a reconnect.

Internal: import what you need from :mod:`guard.server`.
"""
