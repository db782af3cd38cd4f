"""Tenant budgets: rolling per-tenant windows and allowances, in memory for one process
and in Redis for replicas.

Internal: import what you need from :mod:`guard.server`.
"""
