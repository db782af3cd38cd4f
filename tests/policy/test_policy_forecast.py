"""Forecasting the step at which the token or cost budget runs out."""

from __future__ import annotations

import sys

import pytest
from _hyp import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from guard.errors import InvalidInput
from guard.policy import Forecaster, Limits, Usage


def run(b: float, d: float, n: int) -> tuple[Forecaster, Usage]:
    f = Forecaster()
    total = 0
    for i in range(1, n + 1):
        x = int(b + (i - 1) * d)
        f.observe(i, x)
        total += x
    return f, Usage(steps=n, input_tokens=total)


def test_seed_worked_example() -> None:
    """Seed 003: B=6000, D=2500, 400K budget: 16 rounds ~396K, the 17th crosses it."""
    f, usage = run(6000, 2500, 4)
    fc = f.forecast(Limits(max_tokens=400_000), usage)
    assert fc.base_tokens == pytest.approx(6000)
    assert fc.delta_tokens == pytest.approx(2500)
    assert (fc.exhaust_step, fc.metric) == (17, "tokens")


@pytest.mark.parametrize(
    ("b", "d", "observed", "limit", "expected"),
    [
        (1000, 0, 3, 10_000, 10),  # linear: 10 steps of 1000
        (1000, 0, 3, 10_001, 11),
        (1000, 500, 2, 10_000, 5),  # 1000+1500+2000+2500+3000 = 10000
        (100, 0, 5, 400, 5),  # already exhausted -> the current step
    ],
)
def test_exhaust_step_table(b, d, observed, limit, expected) -> None:
    f, usage = run(b, d, observed)
    assert f.forecast(Limits(max_tokens=limit), usage).exhaust_step == expected


def test_output_tokens_count_toward_the_forecast() -> None:
    f, usage = run(1000, 0, 2)
    usage.output_tokens = 2000  # 1000 per step
    assert f.forecast(Limits(max_tokens=10_000), usage).exhaust_step == 5


def test_cost_forecast_with_explicit_and_derived_price() -> None:
    f, usage = run(10_000, 0, 2)
    lim = Limits(max_cost_usd=0.10)
    fc = f.forecast(lim, usage, usd_per_input_token=1e-6)  # 0.01 per step
    assert (fc.exhaust_step, fc.metric) == (10, "cost_usd")
    usage.cost_usd = 0.02  # derived: 1e-6 per token
    assert f.forecast(lim, usage).exhaust_step == 10
    usage.cost_usd = None  # unpriced: no cost forecast
    assert f.forecast(lim, usage).exhaust_step is None


def test_earliest_budget_wins() -> None:
    f, usage = run(10_000, 0, 1)
    fc = f.forecast(Limits(max_tokens=50_000, max_cost_usd=0.03), usage, usd_per_input_token=1e-6)
    assert (fc.exhaust_step, fc.metric) == (3, "cost_usd")


def test_no_limits_no_forecast() -> None:
    f, usage = run(1000, 100, 3)
    fc = f.forecast(Limits(), usage)
    assert fc.exhaust_step is None and fc.metric is None
    assert Forecaster().forecast(Limits(max_tokens=100), Usage()).exhaust_step is None


def test_constant_memory() -> None:
    f = Forecaster()
    size = sys.getsizeof(f)
    for i in range(1, 10_000):
        f.observe(i, i)
    assert sys.getsizeof(f) == size and not hasattr(f, "__dict__")


@pytest.mark.parametrize(("step", "tokens"), [(0, 1), (1, -1), (1.5, 1), (1, True)])
def test_invalid_input(step, tokens) -> None:
    with pytest.raises(InvalidInput):
        Forecaster().observe(step, tokens)


@settings(max_examples=examples(100), deadline=None)
@given(
    b=st.integers(min_value=1, max_value=20_000),
    d=st.integers(min_value=0, max_value=5_000),
    n=st.integers(min_value=2, max_value=30),
)
def test_fit_recovers_exact_growth(b: int, d: int, n: int) -> None:
    f, usage = run(b, d, n)
    fit_b, fit_d = f.fit()
    assert fit_b == pytest.approx(b, abs=1e-6 * b + 1e-3)
    assert fit_d == pytest.approx(d, abs=1e-6 * max(d, 1) + 1e-3)
    limit = usage.tokens * 3
    k = f.forecast(Limits(max_tokens=limit), usage).exhaust_step
    assert k is not None
    cumulative = lambda m: sum(b + (i - 1) * d for i in range(1, m + 1))  # noqa: E731
    assert cumulative(k) >= limit > cumulative(k - 1)
