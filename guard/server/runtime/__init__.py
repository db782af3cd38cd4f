"""What the guard process runs on: auth, the error-to-status boundary, metrics, the
collector's pauses, heap trimming, event-loop lag and the small collections it shares.

Internal: import what you need from :mod:`guard.server`.
"""
