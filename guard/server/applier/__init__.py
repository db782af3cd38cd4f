"""The span applier: decoded observations applied to their runs, then the policy decides.

Internal: import what you need from :mod:`guard.server`.
"""
