"""A nested run's budget and its lineage: spend reaches every ancestor, snapshots and
restores keep the tree consistent, and no budget is part of a reference cycle."""

from __future__ import annotations

import gc

from guard.policy import Budget, Limits, Usage


def _budgets() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is Budget)


def test_a_budget_tree_is_freed_by_reference_counting_alone() -> None:
    """The guard freezes what the collector has seen (server/_gc.py) and frees ended runs by
    reference counting: a budget in a cycle (one that held itself in its own lineage, say)
    would never be freed there."""
    gc.collect()
    gc.disable()
    try:
        before = _budgets()
        root = Budget(Limits(max_tokens=1000))
        mid = Budget(Limits(), parent=root)
        leaf = Budget(Limits(max_steps=5), parent=mid)
        leaf.record_step()
        leaf.step_if_no_escalation()
        leaf.model_call_escalation(10, 1, 0, 0, 0.001)
        leaf.tool_call_escalation(1, None, None)
        leaf.reserve(tokens=5).settle(tokens=3)
        with mid.reserve(tokens=7):
            pass
        leaf.restore(leaf.usage(), leaf.seq)
        assert leaf.escalation() is None and root.decide().utilisation is not None
        assert _budgets() == before + 3
        del root, mid, leaf
        assert _budgets() == before
    finally:
        gc.enable()


def test_a_nested_run_tree_is_snapshotted_at_one_instant() -> None:
    parent = Budget(Limits())
    child = Budget(Limits(), parent=parent)
    child.record_step()
    parent.record_step()
    child.record_model_call(input_tokens=5)
    (pu, ps), (cu, cs) = Budget.snapshot_all([parent, child])
    assert (pu.steps, pu.model_calls, ps) == (2, 1, 1)
    assert (cu.steps, cu.model_calls, cs) == (1, 1, 2)
    # restore sets a budget's own counters, never its parent's
    p2 = Budget(Limits())
    c2 = Budget(Limits(), parent=p2)
    p2.restore(pu, ps)
    c2.restore(cu, cs)
    assert p2.usage() == pu and c2.usage() == cu
    assert c2.record_step() == 3 and p2.usage().steps == 3


def test_a_restored_ancestor_still_receives_its_nested_runs_spend() -> None:
    """A re-registered parent sets its counters after its child exists: the child's records
    must reach the restored counters, not the ones they replaced."""
    root = Budget(Limits())
    mid = Budget(Limits(), parent=root)
    leaf = Budget(Limits(), parent=mid)
    root.restore(Usage(steps=10, input_tokens=100, cost_usd=1.0), 4)
    mid.restore(Usage(steps=5), 2)
    leaf.record_step()
    leaf.record_model_call(input_tokens=7, cost_usd=0.5)
    leaf.record_tool_calls(2)
    assert root.usage() == Usage(
        steps=11, model_calls=1, tool_calls=2, tool_attempts=2, input_tokens=107, cost_usd=1.5
    )
    assert mid.usage() == Usage(
        steps=6, model_calls=1, tool_calls=2, tool_attempts=2, input_tokens=7, cost_usd=0.5
    )
    res = leaf.reserve(tokens=10)
    assert root.reserved().tokens == mid.reserved().tokens == 10
    res.settle(tokens=4)
    assert root.usage().input_tokens == 111 and root.reserved().tokens == 0
    assert root.parent is None and mid.parent is root and leaf.parent is mid
