"""Span decoding: serialized OTLP requests into the guard's observations, over one schema
(the native decoder, with the pure-Python one as fallback and test oracle).

Internal: import what you need from :mod:`guard.server`.
"""
