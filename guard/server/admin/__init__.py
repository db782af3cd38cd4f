"""GuardAdmin: fleet cancel, live runs, tenant budgets and the store's report, on one guard
or, with replicas, through any of them.

Internal: import what you need from :mod:`guard.server`.
"""
