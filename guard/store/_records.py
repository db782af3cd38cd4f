"""Compatibility: the records moved to :mod:`guard.records` (the server must not load the
store to build them); the store and its callers keep importing them from here."""

from __future__ import annotations

from guard.records import DecisionRecord, RecordSink

__all__ = ["DecisionRecord", "RecordSink"]
