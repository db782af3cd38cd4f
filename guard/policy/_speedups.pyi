# The native fast paths of guard/policy/_speedups.c (fingerprints, loop detection, the record
# kernels): what a type checker reads for the C extension. The pure-Python reference of each
# function is named in guard/policy/_fingerprint.py, _loops.py and _kernels.py.
from array import array

# Fingerprints. A hash state is opaque bytes (a SHA-256 context).
def state(data: bytes, base: bytes | None = None, /) -> bytes: ...
def mac(inner: bytes, outer: bytes, payload: str, /) -> str: ...
def action(
    inner: bytes, outer: bytes, args: object, ignore: tuple[bytes, ...], /
) -> str | None: ...
def result(inner: bytes, outer: bytes, value: object, /) -> str | None: ...
def sha256(data: bytes, /) -> bytes: ...

# Loop detection: True/False = quiet or not, None = outside the fast case.
def observe(
    acts: array[int],
    res: array[int],
    slot: int,
    action: str,
    result: str | None,
    need_a: int,
    need_r: int,
    /,
) -> bool | None: ...

# The record kernels (guard/policy/_kernels.py): None = the method must run instead.
def bind(
    budget: type, usage: type, loop_detector: type, forecaster: type, ok: object, /
) -> None: ...
def budget_step(budget: object, also: object, /) -> int | None: ...
def budget_model_call(
    budget: object,
    also: object,
    input_tokens: object,
    output_tokens: object,
    reasoning_tokens: object,
    cached_tokens: object,
    cost_usd: object,
    /,
) -> int | None: ...
def budget_tool_calls(
    budget: object, also: object, n: object, attempts: object, /
) -> int | None: ...
def budget_quiet(budget: object, rank: object, /) -> bool | None: ...
def loop_observe(detector: object, action: object, result: object, /) -> bool | None: ...
def loop_end_step(detector: object, state: object, progress: object, /) -> object: ...
def forecast_observe(
    forecaster: object, step_index: object, input_tokens: object, /
) -> bool | None: ...
