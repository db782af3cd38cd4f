"""Property tests: no byte string or attribute value makes decode or ingest raise."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

from guard.server import MemorySink, decode_request
from guard.server._auth import ANONYMOUS
from guard.server._decode import _KEYS
from guard.server._registry import Registry

from .conftest import config, request, span

values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300),
    st.booleans(),
)
keys = st.sampled_from([*sorted(_KEYS), "http.method", "gen_ai.system"])
spans = st.lists(
    st.tuples(
        st.sampled_from(
            ["chat gpt-4.1", "execute_tool search", "guard.step", "invoke_agent a", "x"]
        ),
        st.dictionaries(keys, values, max_size=8),
        st.sampled_from([b"\x01" * 16, b"\x02" * 16]),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans)
def test_arbitrary_attributes_never_raise(batch):
    registry = Registry(config(), MemorySink(), guard_id="fuzz")
    req = request(*[span(name, tid, attrs) for name, attrs, tid in batch])
    decoded = decode_request(req)
    assert decoded.rejected + len(decoded.observations) <= decoded.spans == len(batch)
    rejected, _ = registry.ingest(decoded, ANONYMOUS)
    assert rejected >= decoded.rejected
    for run in registry.runs.values():
        u = run.budget.usage()
        assert min(u.steps, u.model_calls, u.tool_calls, u.input_tokens, u.output_tokens) >= 0
        assert u.cost_usd is None or u.cost_usd >= 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_either_parse_or_fail_cleanly(data):
    try:
        req = otlp.ExportTraceServiceRequest.FromString(data)
    except Exception:  # the servicer maps this to INVALID_ARGUMENT
        return
    decode_request(req)
