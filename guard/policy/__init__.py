"""The pure policy engine: budgets, the decision order, rolling windows, loop and stagnation
detection (with the poll rule and progress derived from tool results), canonicalisation and
fingerprints, forecasting and the policy file.

No I/O and no grpc, OpenTelemetry, ClickHouse or yaml imports (a test enforces it): the SDK
and the guard run this same code, so a decision means the same thing on both sides.
"""

from guard.policy._allowance import ALLOWANCE_METRICS, AllowanceGrant, TenantAllowances
from guard.policy._budget import Budget, Remaining, Reservation
from guard.policy._canonical import canonicalize
from guard.policy._config import (
    DEFAULT_PRICE_BOOK,
    AuthConfig,
    GuardSettings,
    ModelPrice,
    PolicyConfig,
    PriceBook,
    StoreSettings,
    limits_to_dict,
)
from guard.policy._decide import SoftLevel, decide, utilisation
from guard.policy._fingerprint import Fingerprinter, hash64, native_available, use_native
from guard.policy._forecast import Forecast, Forecaster
from guard.policy._loops import LoopDetector, LoopVerdict
from guard.policy._novelty import ResultNovelty
from guard.policy._parse import parse_limits
from guard.policy._polls import POLL_PATTERN, PollWatch
from guard.policy._presets import PRESETS
from guard.policy._rolling import (
    ROLLING_METRICS,
    RollingLimit,
    RollingWindow,
    TenantBudget,
    TenantLimits,
    TenantReservation,
)
from guard.policy._telemetry import MetricsSettings, parse_metrics
from guard.policy._types import (
    CONTINUE,
    DEFAULT_SOFT_THRESHOLDS,
    METRIC_REASON,
    REASON_STATUS,
    USAGE_COUNTERS,
    Action,
    DecidedBy,
    Decision,
    Limits,
    LoopSettings,
    Outcome,
    Phase,
    Reason,
    Status,
    Usage,
)

__all__ = [
    "ALLOWANCE_METRICS",
    "CONTINUE",
    "DEFAULT_PRICE_BOOK",
    "DEFAULT_SOFT_THRESHOLDS",
    "METRIC_REASON",
    "POLL_PATTERN",
    "PRESETS",
    "REASON_STATUS",
    "ROLLING_METRICS",
    "USAGE_COUNTERS",
    "Action",
    "AllowanceGrant",
    "AuthConfig",
    "Budget",
    "DecidedBy",
    "Decision",
    "Fingerprinter",
    "Forecast",
    "Forecaster",
    "GuardSettings",
    "Limits",
    "LoopDetector",
    "LoopSettings",
    "LoopVerdict",
    "MetricsSettings",
    "ModelPrice",
    "Outcome",
    "Phase",
    "PolicyConfig",
    "PollWatch",
    "PriceBook",
    "Reason",
    "Remaining",
    "Reservation",
    "ResultNovelty",
    "RollingLimit",
    "RollingWindow",
    "SoftLevel",
    "Status",
    "StoreSettings",
    "TenantAllowances",
    "TenantBudget",
    "TenantLimits",
    "TenantReservation",
    "Usage",
    "canonicalize",
    "decide",
    "hash64",
    "limits_to_dict",
    "native_available",
    "parse_limits",
    "parse_metrics",
    "use_native",
    "utilisation",
]
