"""The decision router: policy decisions turned into warn, wrap-up and cancel commands.

Internal: import what you need from :mod:`guard.server`.
"""
