"""Record sinks the server can use without a store.

Internal: import what you need from :mod:`guard.server`.
"""
