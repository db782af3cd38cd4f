"""The control stream: GuardControl.Attach, one bidirectional stream per agent process,
the fan-out of commands and acks, and each agent's clock skew.

Internal: import what you need from :mod:`guard.server`.
"""
