"""The native extensions against hostile Python values passed to their module-level functions.

Not reachable from the wire: these are objects a caller could hand the C functions directly,
whose dunders (``__iadd__``, ``__bool__``, ``__len__``, ``locked()``, ...) rebind the fields
being worked on, raise, or clear the lists being walked, plus forged states, out-of-range
indexes and negative positions. CPython's own C survives such objects, and ours must too:
each case asserts a clean Python exception or a correct result, never a crash. ``make
test-asan`` runs this module with the extensions built under ASan/UBSan, where a
use-after-free or an overflow that the normal build survives by luck is reported.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import struct
import sys
from array import array
from typing import Any

import pytest

sp = pytest.importorskip("guard.policy._speedups")
otlp = pytest.importorskip("guard.server.decode._otlpnative")
applyn = pytest.importorskip("guard.server.applier._applynative")
rows = pytest.importorskip("guard.store._rowsnative")

from guard.policy import Budget, Forecaster, Limits, LoopDetector, LoopSettings, Usage  # noqa: E402
from guard.policy._kernels import CONTINUE_VERDICT, record_kernels  # noqa: E402

KERNELS = record_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="the record kernels are off")


def _fresh(text: str) -> str:
    """A str object nothing else holds (not interned, not a constant)."""
    return "".join(list(text))


def _fp(i: int) -> str:
    return _fresh(f"{i:016x}{i:016x}")


# ---- _speedups: SHA-256 states -------------------------------------------------------------

STATE_SIZE = len(sp.state(b""))


def _forged(buflen: int, length: int | None = None) -> bytes:
    """A state of the right size whose buffered count is ``buflen`` (and total ``length``)."""
    good = bytearray(sp.state(b"abc"))
    # sha_ctx: h[8] (32 bytes), len (uint64 at 32), buflen (uint32 at 40), buf[64]
    struct.pack_into("=QI", good, 32, 3 if length is None else length, buflen)
    return bytes(good)


@pytest.mark.parametrize("buflen", [64, 65, 200, 0xFFFFFFFF])
def test_a_forged_state_is_refused_not_absorbed(buflen: int) -> None:
    outer = sp.state(b"outer")
    forged = _forged(buflen)
    for call in (
        lambda: sp.mac(forged, outer, "payload" * 20),
        lambda: sp.mac(sp.state(b"k"), forged, "payload"),
        lambda: sp.state(b"x" * 100, forged),
        lambda: sp.result(forged, outer, 7),
        lambda: sp.action(forged, outer, {"a": 1}, ()),
    ):
        with pytest.raises((TypeError, ValueError)):
            call()


def test_a_state_whose_counts_disagree_is_refused() -> None:
    with pytest.raises((TypeError, ValueError)):
        sp.mac(_forged(5, length=64 + 3), sp.state(b"o"), "x")


@pytest.mark.parametrize("size", [0, 1, STATE_SIZE - 1, STATE_SIZE + 1, 4096])
def test_a_state_of_another_size_is_refused(size: int) -> None:
    with pytest.raises((TypeError, ValueError)):
        sp.mac(b"\0" * size, sp.state(b"o"), "x")
    with pytest.raises((TypeError, ValueError)):
        sp.state(b"x", bytearray(STATE_SIZE))  # not bytes


def test_real_states_still_hash() -> None:
    import hashlib
    import hmac

    key = b"k" * 64
    inner = sp.state(bytes(b ^ 0x36 for b in key))
    outer = sp.state(bytes(b ^ 0x5C for b in key))
    for n in (0, 1, 55, 56, 63, 64, 65, 300):
        msg = "x" * n
        want = hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()[:32]
        assert sp.mac(inner, outer, msg) == want


# ---- _speedups: observe ------------------------------------------------------------------


@pytest.mark.parametrize("slot", [-1, 4, 2**40, -(2**70), 2**70])
def test_observe_bounds_its_slot(slot: int) -> None:
    a, r = array("Q", [0] * 4), array("Q", [0] * 4)
    with pytest.raises((ValueError, OverflowError)):
        sp.observe(a, r, slot, _fp(1), None, 2, 2)
    assert list(a) == [0] * 4


class _Index:
    def __index__(self) -> int:
        raise RuntimeError("no")


def test_observe_refuses_non_int_counts() -> None:
    a, r = array("Q", [0] * 4), array("Q", [0] * 4)
    with pytest.raises(TypeError):
        sp.observe(a, r, _Index(), _fp(1), None, 2, 2)


# ---- _speedups: the record kernels -------------------------------------------------------


class _Rebinder:
    """A counter whose += rebinds the field it is read from (and is then freed)."""

    def __init__(self, holder: Any, field: str, then: Any) -> None:
        self.holder, self.field, self.then = holder, field, then

    def __iadd__(self, other: Any) -> Any:
        setattr(self.holder, self.field, self.then)
        self.holder = None
        return 41 + other

    def __add__(self, other: Any) -> Any:
        return self.__iadd__(other)

    __radd__ = __add__


@needs_kernels
def test_slot_add_survives_an_iadd_that_rebinds_the_field() -> None:
    b, also = Budget(Limits()), Usage()
    also.steps = _Rebinder(also, "steps", 1000)
    seq = KERNELS.budget_step(b, also)
    gc.collect()
    if seq is None:  # refused (a counter that is not a plain int): the method's to record
        assert b.seq == 0 and isinstance(also.steps, _Rebinder)
        b.record_step()
        also.steps += 1
    else:
        assert seq == b.seq
    assert also.steps == 42  # what `also.steps += 1` leaves: the += result wins


@needs_kernels
def test_slot_add_survives_an_iadd_that_deletes_the_field() -> None:
    b, also = Budget(Limits()), Usage()

    class Deleter:
        def __iadd__(self, other: Any) -> Any:
            del also.steps
            return 5

    also.steps = Deleter()
    if KERNELS.budget_step(b, also) is None:
        also.steps += 1
    assert also.steps == 5


@needs_kernels
def test_slot_add_survives_an_iadd_that_unsets_the_budget_seq() -> None:
    b, also = Budget(Limits()), Usage()

    class Unset:
        def __iadd__(self, other: Any) -> Any:
            del b._seq
            return 5

    also.steps = Unset()
    try:
        out = KERNELS.budget_step(b, also)
    except AttributeError:
        return
    assert out is None or isinstance(out, int)


class _Lock:
    """A lock whose locked() (and acquire()) rebinds the budget's usages, then says free."""

    def __init__(self, budget: Any, real: Any) -> None:
        self.budget, self.real = budget, real

    def _rebind(self) -> None:
        if self.budget is not None:
            self.budget._usages = tuple(Usage() for _ in range(3))
            self.budget = None
            gc.collect()

    def locked(self) -> bool:
        self._rebind()
        return self.real.locked()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._rebind()
        return self.real.acquire(blocking, timeout)

    def release(self) -> None:
        self.real.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


@needs_kernels
@pytest.mark.parametrize("kernel", ["step", "model", "tools", "quiet"])
def test_kernels_survive_a_lock_that_replaces_the_usages(kernel: str) -> None:
    parent = Budget(Limits())
    b = Budget(Limits(), parent=Budget(Limits(), parent=parent))
    real = b._lock
    b._usages = tuple(Usage() for _ in range(40))  # a big tuple, freed by the rebinding
    b._lock = _Lock(b, real)
    also = Usage()
    if kernel == "step":
        out = KERNELS.budget_step(b, also)
    elif kernel == "model":
        out = KERNELS.budget_model_call(b, also, 1, 2, 0, 0, 0.5)
    elif kernel == "tools":
        out = KERNELS.budget_tool_calls(b, also, 2, 3)
    else:
        out = KERNELS.budget_quiet(b, 1)
    assert out is None or isinstance(out, (int, bool))
    assert not real.locked()


@needs_kernels
def test_kernels_refuse_while_the_lock_is_held() -> None:
    b, also = Budget(Limits()), Usage()
    with b._lock:
        assert KERNELS.budget_step(b, also) is None
        assert KERNELS.budget_model_call(b, also, 1, 2, 0, 0, None) is None
        assert KERNELS.budget_tool_calls(b, also, 1, 1) is None
    assert b.seq == 0 and also == Usage()
    assert KERNELS.budget_step(b, also) == 1


@needs_kernels
def test_kernels_release_the_lock_on_an_error() -> None:
    b, also = Budget(Limits()), Usage()

    class Boom:
        def __iadd__(self, other: Any) -> Any:
            raise ZeroDivisionError

    b._usage.steps = Boom()
    with contextlib.suppress(ZeroDivisionError):  # refused: not a plain count
        assert KERNELS.budget_step(b, also) is None
    assert not b._lock.locked()


class _Raises:
    def __bool__(self) -> bool:
        raise ZeroDivisionError

    def __iadd__(self, other: Any) -> Any:
        raise ZeroDivisionError

    __add__ = __radd__ = __iadd__


@needs_kernels
def test_add_cost_survives_a_bool_that_rebinds_the_cost() -> None:
    b, also = Budget(Limits()), Usage()

    class Cost(float):
        def __bool__(self) -> bool:
            also.cost_usd = 3.0
            return True

    also.cost_usd = Cost(1.5)
    out = KERNELS.budget_model_call(b, also, 1, 2, 0, 0, 0.25)
    gc.collect()
    if out is None:  # refused (not a plain cost): the method's to record
        assert b.seq == 0
    else:
        assert out == b.seq and also.cost_usd == 1.75


@needs_kernels
def test_add_cost_raising_is_an_exception() -> None:
    b, also = Budget(Limits()), Usage()
    also.cost_usd = _Raises()
    with contextlib.suppress(ZeroDivisionError):
        assert KERNELS.budget_model_call(b, also, 1, 2, 0, 0, 0.25) is None


@needs_kernels
@pytest.mark.parametrize("count", [-1, -(2**80), 2**80])
def test_counts_of_any_size_and_sign(count: int) -> None:
    b, also = Budget(Limits()), Usage()
    out = KERNELS.budget_model_call(b, also, count, 0, 0, 0, None)
    if count < 0:
        assert out is None and b.seq == 0
    else:
        assert out == 1 and also.input_tokens == count


class _Settings:
    """Loop settings whose attribute reads rebind the detector's fields."""

    def __init__(self, det: Any, real: Any) -> None:
        self.det, self.real = det, real

    def __getattr__(self, name: str) -> Any:
        det = self.__dict__.get("det")
        if det is not None:
            self.__dict__["det"] = None
            det.settings = self.real  # frees this object once the call returns
            det._n = 2**80
            gc.collect()
        return getattr(self.real, name)


@needs_kernels
def test_loop_observe_survives_settings_that_rebind_the_detector() -> None:
    cfg = LoopSettings(window=4, repeat_threshold=2, no_progress_steps=3)
    d = LoopDetector(cfg)
    d.settings = _Settings(d, cfg)
    out = KERNELS.loop_observe(d, _fp(1), None)
    assert out in (None, True, False)


@needs_kernels
def test_loop_observe_survives_an_int_subclass_count() -> None:
    cfg = LoopSettings(window=4, repeat_threshold=2, no_progress_steps=3)
    d = LoopDetector(cfg)

    class N(int):
        def __add__(self, other: Any) -> Any:
            d._n = 7
            return 99

    d._n = N(1)
    out = KERNELS.loop_observe(d, _fp(1), None)
    assert out in (None, True, False)


@needs_kernels
def test_loop_end_step_survives_a_len_that_rebinds_the_bits() -> None:
    cfg = LoopSettings(window=4, repeat_threshold=2, no_progress_steps=3)
    d = LoopDetector(cfg)

    class Ring(array):
        def __len__(self) -> int:
            d._gbits = 2**200 + 1  # frees the old big int
            d._n = 2**90
            gc.collect()
            return 4

    d._gbits = 2**100 + 3
    d._acts = Ring("Q", [0] * 4)
    out = KERNELS.loop_end_step(d, None, True)
    assert out is None or out is CONTINUE_VERDICT


@needs_kernels
def test_forecast_observe_with_deleted_fields() -> None:
    f = Forecaster()
    del f._sx
    assert KERNELS.forecast_observe(f, 1, 10) is None
    f = Forecaster()
    assert KERNELS.forecast_observe(f, 1, 10) is True


def test_bind_is_all_or_nothing() -> None:
    """A bind() that fails part-way must leave the kernels bound as they were."""
    from guard.policy._loops import _OK

    class NotABudget:
        __slots__ = ("_usages",)

    with pytest.raises((TypeError, AttributeError)):
        sp.bind(NotABudget, Usage, LoopDetector, Forecaster, _OK)

    class Other:
        __slots__ = ("x",)

    with pytest.raises((TypeError, AttributeError)):
        sp.bind(Budget, Other, LoopDetector, Forecaster, _OK)
    if KERNELS is not None:
        b, also = Budget(Limits()), Usage()
        assert KERNELS.budget_step(b, also) == 1 and also.steps == 1


def test_bind_refuses_a_shadowed_slot() -> None:
    from guard.policy._loops import _OK

    class Shadow(Forecaster):
        _n = property(lambda self: 0)

    with pytest.raises((TypeError, AttributeError)):
        sp.bind(Budget, Usage, LoopDetector, Shadow, _OK)
    sp.bind(Budget, Usage, LoopDetector, Forecaster, _OK)  # as guard.policy._kernels binds


# ---- _otlpnative ---------------------------------------------------------------------------


def _decode_module() -> Any:
    from guard.server.decode import _nativedecode

    return _nativedecode


def _reconfigure() -> None:
    importlib.reload(_decode_module())


def _configure_args() -> list[Any]:
    from guard import semconv as sc

    s = sys.modules[_decode_module().__name__].s
    slots = {name: getattr(s, name) for name in (
        "RUN_ID", "OP", "MODEL", "RESP_MODEL", "IN", "OUT", "CACHED", "REASONING",
        "TOOL_NAME", "ERROR", "KIND", "FOREIGN", "TRACE_ID", "SPAN_ID", "PARENT_SPAN_ID",
        "NSLOTS", "KIND_RUN", "KIND_STEP", "KIND_MODEL", "KIND_TOOL",
    )}  # fmt: skip
    return [
        dict(s.KEYS),
        slots,
        s.Observation,
        sorted(s.MODEL_OPS),
        sorted(s.AGGREGATE_OPS),
        (s.MAX_COUNTER, s.MAX_ID_CHARS, s.MAX_COST),
        (s.ACTION_FP, s.RESULT_HASH, s.STATE_HASH, s.RESP_ID),
        (sc.STEP_SPAN, sc.INVOKE_AGENT, sc.EXECUTE_TOOL),
    ]


@pytest.mark.parametrize("name", ["RUN_ID", "OP", "KIND", "PARENT_SPAN_ID", "CACHED"])
@pytest.mark.parametrize("value", [-1, 48, 10**6, 2**63])
def test_configure_bounds_every_slot_index(name: str, value: int) -> None:
    args = _configure_args()
    args[1] = dict(args[1], **{name: value})
    try:
        with pytest.raises((ValueError, OverflowError)):
            otlp.configure(*args)
    finally:
        _reconfigure()


def test_configure_refuses_a_bad_kind_and_a_non_int() -> None:
    args = _configure_args()
    try:
        with pytest.raises((ValueError, TypeError)):
            otlp.configure(*([*args[:1], dict(args[1], KIND_RUN=9), *args[2:]]))
        with pytest.raises(TypeError):
            otlp.configure(*([*args[:1], dict(args[1], OP="1"), *args[2:]]))
    finally:
        _reconfigure()


def _request() -> bytes:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts

    from guard.v1 import guard_pb2  # noqa: F401  (the generated classes load opentelemetry's)

    req = ts.ExportTraceServiceRequest()
    for r in range(2):
        rs = req.resource_spans.add()
        for q in range(2):
            ss = rs.scope_spans.add()
            for k in range(3):
                sp_ = ss.spans.add()
                sp_.name = "chat"
                sp_.trace_id = bytes([r + 1]) * 16
                sp_.span_id = bytes([k + 1]) * 8
                a = sp_.attributes.add()
                a.key = "gen_ai.usage.input_tokens"
                a.value.int_value = 10 + k + q
    return req.SerializeToString()


@pytest.mark.parametrize(
    "state",
    [
        (-1, 0, 0, 0),
        (0, 0, -5, 0),
        (0, 1, -5, 0),
        (5, 2, 10, -3),
        (5, 2, -10, -3),
        (10, 2, 5, 20),  # the scope ends after its resource
        (20, 1, 10, 0),  # a position past its resource's end
        (0, 3, 0, 0),
        (0, -1, 0, 0),
        (2**62, 0, 0, 0),
        (0, 0, 2**62, 0),
    ],
)
def test_decode_refuses_a_bad_resume_state(state: tuple[int, ...]) -> None:
    data = _request()
    with pytest.raises((ValueError, OverflowError)):
        otlp.decode(data, state, 100)


def test_decode_resumes_from_its_own_states() -> None:
    data = _request()
    whole = otlp.decode(data, None, 10**6)
    assert whole is not None
    got, state = [], None
    while True:
        res = otlp.decode(data, state, 1)
        assert res is not None
        obs, _, state = res
        got += [list(o) for o in obs]
        if state is None:
            break
    assert got == [list(o) for o in whole[0]]


@pytest.mark.parametrize("state", [(0, 0, 0), "abcd", (0.5, 0, 0, 0), [0, 0, 0, 0]])
def test_decode_refuses_a_malformed_state(state: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        otlp.decode(_request(), state, 10)


@pytest.mark.parametrize("max_spans", [-1, 0, -(2**70)])
def test_decode_with_no_room(max_spans: int) -> None:
    try:
        res = otlp.decode(_request(), None, max_spans)
    except OverflowError:
        return
    assert res is not None and res[1] == 0


# ---- _applynative --------------------------------------------------------------------------


@pytest.fixture
def native_side() -> Any:
    from guard.server.applier import _nativeapply

    if _nativeapply.applier() is None:
        pytest.skip("the native applier is off")
    mod = importlib.import_module("server.test_applier_native")
    ref = importlib.import_module("server.test_applier_reference")
    side = mod.NativeSide(native=True)
    side.apply(("register", 0, 0), None)
    return side, mod, ref, _nativeapply


def _tool(mod: Any, fp: Any, attempts: Any = 1, result: Any = None, name: Any = "search") -> Any:
    from guard.server.decode import _schema as s

    spec = {"kind": s.KIND_TOOL, "fp": fp, "result": result, "attempts": attempts, "name": name}
    return mod._observation(0, None, spec, 0)


def _apply(nat: Any, side: Any, obs: list[Any]) -> Any:
    touched: dict[Any, Any] = {}
    spent: dict[Any, Any] = {}
    fns = nat.applier()
    try:
        i = fns.apply(obs, 0, touched, spent, side.reg.runs, None)
    except Exception as exc:  # a clean exception is an answer
        return exc
    fns.flush(touched, spent)
    return i


def test_apply_survives_a_bool_that_rebinds_the_fingerprint(native_side: Any) -> None:
    from guard.server.decode import _schema as s

    side, mod, _, nat = native_side
    holder: list[Any] = []

    class Attempts(int):
        def __bool__(self) -> bool:
            holder[0][s.ACTION_FP] = None  # frees the fingerprint the applier read
            holder[0][s.TOOL_NAME] = None
            gc.collect()
            return True

    o = _tool(mod, _fp(7), attempts=Attempts(1), name=_fresh("search"))
    holder.append(o)
    out = _apply(nat, side, [o])
    assert isinstance(out, (int, Exception))


def test_apply_survives_a_bool_that_clears_the_observations(native_side: Any) -> None:
    from guard.server.decode import _schema as s

    side, mod, _, nat = native_side
    obs: list[Any] = []

    class Attempts(int):
        def __bool__(self) -> bool:
            for o in obs:
                o.clear()
            obs.clear()
            gc.collect()
            return True

    obs += [_tool(mod, _fp(k + 1), attempts=Attempts(1), name=_fresh("t")) for k in range(4)]
    assert all(len(o) == s.NSLOTS for o in obs)
    out = _apply(nat, side, obs)
    assert isinstance(out, (int, Exception))


def test_apply_survives_a_bool_that_drops_the_run(native_side: Any) -> None:
    side, mod, _ref, nat = native_side
    runs = side.reg.runs

    class Name(str):
        def __bool__(self) -> bool:
            runs.clear()
            gc.collect()
            return True

    obs = [_tool(mod, _fp(k + 1), name=Name("n")) for k in range(3)]
    touched: dict[Any, Any] = {}
    spent: dict[Any, Any] = {}
    try:
        out = nat.applier().apply(obs, 0, touched, spent, runs, None)
    except Exception:
        return
    assert isinstance(out, int)


def test_apply_survives_an_iadd_that_rebinds_the_run_field(native_side: Any) -> None:
    """slot_add on the run's own fields (step_tools += 1): the += result is stored."""
    side, mod, _, nat = native_side
    run = next(iter(side.reg.runs.values()))
    run.step_tools = _Rebinder(run, "step_tools", 1000)
    out = _apply(nat, side, [_tool(mod, _fp(3))])
    gc.collect()
    assert isinstance(out, (int, Exception))
    if out == 1:
        assert run.step_tools == 42


def test_apply_never_returns_with_an_exception_set(native_side: Any) -> None:
    from guard.server.decode import _schema as s

    side, mod, _, nat = native_side
    o = _tool(mod, _fp(1))
    o[s.KIND] = 2**80  # PyLong_AsLong overflows
    assert _apply(nat, side, [o]) == 0
    m = mod._observation(0, None, {"kind": s.KIND_MODEL, "in": 1, "out": 1, "cached": 0,
                                   "reasoning": 0, "cost": 0.1, "model": "m", "resp": None,
                                   "foreign": False, "parent": b""}, 0)  # fmt: skip
    m[s.FOREIGN] = _Raises()  # truthy(): __bool__ raises
    out = _apply(nat, side, [m])
    assert isinstance(out, ZeroDivisionError)
    m[s.FOREIGN] = False
    m[s.RESP_ID] = _Raises()
    assert isinstance(_apply(nat, side, [m]), ZeroDivisionError)


def test_apply_refuses_a_bad_start(native_side: Any) -> None:
    side, mod, _, nat = native_side
    fns = nat.applier()
    with pytest.raises((ValueError, OverflowError)):
        fns.apply([], -1, {}, {}, side.reg.runs, None)
    with pytest.raises((TypeError,)):
        fns.apply([], _Index(), {}, {}, side.reg.runs, None)
    assert fns.apply([_tool(mod, _fp(1))], 10, {}, {}, side.reg.runs, None) == 10


def test_flush_and_conclude_survive_a_dict_emptied_under_them(native_side: Any) -> None:
    side, mod, _, nat = native_side
    fns = nat.applier()
    obs = [_tool(mod, _fp(k + 1)) for k in range(3)]
    touched: dict[Any, Any] = {}
    spent: dict[Any, Any] = {}
    assert fns.apply(obs, 0, touched, spent, side.reg.runs, None) == 3
    run = next(iter(touched))
    entry = touched[run]

    class N(int):
        def __bool__(self) -> bool:
            touched.clear()
            gc.collect()
            return True

    entry.tools = N(3)
    side.reg.runs.clear()
    del run, entry
    with contextlib.suppress(Exception):
        fns.flush(touched, spent)
    assert fns.apply(obs, 0, touched, spent, {}, None) == 0


def test_conclude_survives_a_decide_that_empties_touched(native_side: Any) -> None:
    side, mod, _, nat = native_side
    fns = nat.applier()
    obs = [_tool(mod, _fp(k + 1)) for k in range(3)]
    touched: dict[Any, Any] = {}
    spent: dict[Any, Any] = {}
    assert fns.apply(obs, 0, touched, spent, side.reg.runs, None) == 3
    run = next(iter(touched))

    class Soft:
        @property
        def rank(self) -> int:
            touched.clear()
            side.reg.runs.clear()
            gc.collect()
            return 0

    run.soft = Soft()
    del run
    calls: list[Any] = []
    with contextlib.suppress(Exception):
        fns.conclude(touched, 1.0, lambda r, e: calls.append(r))


def test_apply_configure_bounds_its_slots() -> None:
    from guard.server.applier import _nativeapply
    from guard.server.decode import _schema as s

    if _nativeapply.applier() is None:
        pytest.skip("the native applier is off")
    good = tuple(range(17))
    types = (_nativeapply.RunState, _nativeapply.Touched, _nativeapply.Usage)
    rest = ((1, 2, 3, 4), (1, 2, 3), tuple(KERNELS or (None,) * 7), None, 3)
    try:
        for bad in (-1, s.NSLOTS, 10**6, 2**70, "1"):
            with pytest.raises((ValueError, TypeError, OverflowError)):
                applyn.configure(*types, (bad, *good[1:]), s.NSLOTS, *rest)
        for nslots in (-1, 0, 5, "32", 2**70):  # every slot must lie inside nslots
            with pytest.raises((ValueError, TypeError, OverflowError)):
                applyn.configure(*types, good, nslots, *rest)
        with pytest.raises((ValueError, TypeError, OverflowError)):
            applyn.configure(*types, good, s.NSLOTS, (2**70, 2, 3, 4), *rest[1:])
        # a failed configure leaves the applier as it was: still bounded by the old nslots
        side_obs = [[None] * 3]
        assert applyn.apply(side_obs, 0, {}, {}, {}, None) == 0
    finally:
        _nativeapply._configured = None
        assert _nativeapply.applier() is not None


# ---- _rowsnative ---------------------------------------------------------------------------


def test_rows_line_refuses_wrong_shapes() -> None:
    with pytest.raises(TypeError):
        rows.line((None,) * 3)
    with pytest.raises(TypeError):
        rows.line([None] * 28)

    class S(str):
        def __len__(self) -> int:
            raise ZeroDivisionError

    assert rows.line((S("x"),) + (None,) * 27) is None
