from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Limits(_message.Message):
    __slots__ = ("max_steps", "max_tool_calls", "max_model_calls", "max_tokens", "max_cost_usd", "deadline_s", "reserve_tokens", "reserve_s", "soft_thresholds", "loop", "pause_freezes_deadline", "implicit_estimates")
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_USD_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    RESERVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_S_FIELD_NUMBER: _ClassVar[int]
    SOFT_THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    LOOP_FIELD_NUMBER: _ClassVar[int]
    PAUSE_FREEZES_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    IMPLICIT_ESTIMATES_FIELD_NUMBER: _ClassVar[int]
    max_steps: int
    max_tool_calls: int
    max_model_calls: int
    max_tokens: int
    max_cost_usd: float
    deadline_s: float
    reserve_tokens: int
    reserve_s: float
    soft_thresholds: _containers.RepeatedScalarFieldContainer[float]
    loop: LoopPolicy
    pause_freezes_deadline: bool
    implicit_estimates: bool
    def __init__(self, max_steps: _Optional[int] = ..., max_tool_calls: _Optional[int] = ..., max_model_calls: _Optional[int] = ..., max_tokens: _Optional[int] = ..., max_cost_usd: _Optional[float] = ..., deadline_s: _Optional[float] = ..., reserve_tokens: _Optional[int] = ..., reserve_s: _Optional[float] = ..., soft_thresholds: _Optional[_Iterable[float]] = ..., loop: _Optional[_Union[LoopPolicy, _Mapping]] = ..., pause_freezes_deadline: _Optional[bool] = ..., implicit_estimates: _Optional[bool] = ...) -> None: ...

class LoopPolicy(_message.Message):
    __slots__ = ("window", "repeat_threshold", "no_progress_steps", "poll_tools", "max_unchanged_polls")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    REPEAT_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    NO_PROGRESS_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLL_TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_UNCHANGED_POLLS_FIELD_NUMBER: _ClassVar[int]
    window: int
    repeat_threshold: int
    no_progress_steps: int
    poll_tools: _containers.RepeatedScalarFieldContainer[str]
    max_unchanged_polls: int
    def __init__(self, window: _Optional[int] = ..., repeat_threshold: _Optional[int] = ..., no_progress_steps: _Optional[int] = ..., poll_tools: _Optional[_Iterable[str]] = ..., max_unchanged_polls: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("steps", "model_calls", "tool_calls", "tool_attempts", "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "cost_usd")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    steps: int
    model_calls: int
    tool_calls: int
    tool_attempts: int
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    cost_usd: float
    def __init__(self, steps: _Optional[int] = ..., model_calls: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tool_attempts: _Optional[int] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("run_id", "parent_run_id", "tenant", "agent", "status", "reason", "message", "usage", "elapsed_ms", "deadline_ms", "last_tool", "last_action_hash", "loop_hits", "partial_result", "recoverable", "decided_by", "price_book_version", "started_at_unix", "ended_at_unix", "trace_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_TOOL_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTION_HASH_FIELD_NUMBER: _ClassVar[int]
    LOOP_HITS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_RESULT_FIELD_NUMBER: _ClassVar[int]
    RECOVERABLE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    PRICE_BOOK_VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    parent_run_id: str
    tenant: str
    agent: str
    status: str
    reason: str
    message: str
    usage: Usage
    elapsed_ms: int
    deadline_ms: int
    last_tool: str
    last_action_hash: str
    loop_hits: int
    partial_result: bool
    recoverable: bool
    decided_by: str
    price_book_version: str
    started_at_unix: float
    ended_at_unix: float
    trace_id: str
    def __init__(self, run_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., agent: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., elapsed_ms: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., last_tool: _Optional[str] = ..., last_action_hash: _Optional[str] = ..., loop_hits: _Optional[int] = ..., partial_result: _Optional[bool] = ..., recoverable: _Optional[bool] = ..., decided_by: _Optional[str] = ..., price_book_version: _Optional[str] = ..., started_at_unix: _Optional[float] = ..., ended_at_unix: _Optional[float] = ..., trace_id: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("process_id", "host", "pid", "tenant", "sdk_version", "live_runs", "ended_runs", "accepts_batches", "agent_time_unix")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIVE_RUNS_FIELD_NUMBER: _ClassVar[int]
    ENDED_RUNS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIME_UNIX_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    host: str
    pid: int
    tenant: str
    sdk_version: str
    live_runs: _containers.RepeatedCompositeFieldContainer[RunStarted]
    ended_runs: _containers.RepeatedScalarFieldContainer[str]
    accepts_batches: bool
    agent_time_unix: float
    def __init__(self, process_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., tenant: _Optional[str] = ..., sdk_version: _Optional[str] = ..., live_runs: _Optional[_Iterable[_Union[RunStarted, _Mapping]]] = ..., ended_runs: _Optional[_Iterable[str]] = ..., accepts_batches: _Optional[bool] = ..., agent_time_unix: _Optional[float] = ...) -> None: ...

class RunStarted(_message.Message):
    __slots__ = ("run_id", "trace_id", "parent_run_id", "tenant", "agent", "requested", "started_at_unix", "usage", "request_id", "span_seq")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_SEQ_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    trace_id: str
    parent_run_id: str
    tenant: str
    agent: str
    requested: Limits
    started_at_unix: float
    usage: Usage
    request_id: int
    span_seq: int
    def __init__(self, run_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., agent: _Optional[str] = ..., requested: _Optional[_Union[Limits, _Mapping]] = ..., started_at_unix: _Optional[float] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., request_id: _Optional[int] = ..., span_seq: _Optional[int] = ...) -> None: ...

class RunProgress(_message.Message):
    __slots__ = ("run_id", "usage", "paused")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    usage: Usage
    paused: bool
    def __init__(self, run_id: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., paused: _Optional[bool] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunProgress]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunProgress, _Mapping]]] = ...) -> None: ...

class RunEnded(_message.Message):
    __slots__ = ("outcome",)
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    def __init__(self, outcome: _Optional[_Union[Outcome, _Mapping]] = ...) -> None: ...

class AllowanceRequest(_message.Message):
    __slots__ = ("run_id", "request_id", "cost_usd", "tokens", "usage")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    request_id: int
    cost_usd: float
    tokens: int
    usage: Usage
    def __init__(self, run_id: _Optional[str] = ..., request_id: _Optional[int] = ..., cost_usd: _Optional[float] = ..., tokens: _Optional[int] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("command_id", "run_id", "applied")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    run_id: str
    applied: bool
    def __init__(self, command_id: _Optional[int] = ..., run_id: _Optional[str] = ..., applied: _Optional[bool] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "run_started", "heartbeat", "run_ended", "ack", "allowance_request", "batch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RUN_STARTED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    RUN_ENDED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ALLOWANCE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    run_started: RunStarted
    heartbeat: Heartbeat
    run_ended: RunEnded
    ack: Ack
    allowance_request: AllowanceRequest
    batch: AgentBatch
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., run_started: _Optional[_Union[RunStarted, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., run_ended: _Optional[_Union[RunEnded, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., allowance_request: _Optional[_Union[AllowanceRequest, _Mapping]] = ..., batch: _Optional[_Union[AgentBatch, _Mapping]] = ...) -> None: ...

class AgentBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[AgentMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[AgentMessage, _Mapping]]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("guard_id", "session_id", "heartbeat_interval_ms", "agent_grace_s", "policy", "accepts_batches")
    GUARD_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    AGENT_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    guard_id: str
    session_id: str
    heartbeat_interval_ms: int
    agent_grace_s: int
    policy: Policy
    accepts_batches: bool
    def __init__(self, guard_id: _Optional[str] = ..., session_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., agent_grace_s: _Optional[int] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., accepts_batches: _Optional[bool] = ...) -> None: ...

class Admit(_message.Message):
    __slots__ = ("run_id", "request_id", "effective", "price_book_version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    PRICE_BOOK_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    request_id: int
    effective: Limits
    price_book_version: str
    def __init__(self, run_id: _Optional[str] = ..., request_id: _Optional[int] = ..., effective: _Optional[_Union[Limits, _Mapping]] = ..., price_book_version: _Optional[str] = ...) -> None: ...

class Directive(_message.Message):
    __slots__ = ("run_id", "request_id", "reason", "detail", "utilisation", "metric")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    request_id: int
    reason: str
    detail: str
    utilisation: float
    metric: str
    def __init__(self, run_id: _Optional[str] = ..., request_id: _Optional[int] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., utilisation: _Optional[float] = ..., metric: _Optional[str] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("version", "run_defaults", "prices")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    PRICES_FIELD_NUMBER: _ClassVar[int]
    version: str
    run_defaults: Limits
    prices: PriceBook
    def __init__(self, version: _Optional[str] = ..., run_defaults: _Optional[_Union[Limits, _Mapping]] = ..., prices: _Optional[_Union[PriceBook, _Mapping]] = ...) -> None: ...

class PriceBook(_message.Message):
    __slots__ = ("version", "models")
    class ModelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelPrice
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelPrice, _Mapping]] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    version: str
    models: _containers.MessageMap[str, ModelPrice]
    def __init__(self, version: _Optional[str] = ..., models: _Optional[_Mapping[str, ModelPrice]] = ...) -> None: ...

class ModelPrice(_message.Message):
    __slots__ = ("input", "output", "cached_input")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CACHED_INPUT_FIELD_NUMBER: _ClassVar[int]
    input: float
    output: float
    cached_input: float
    def __init__(self, input: _Optional[float] = ..., output: _Optional[float] = ..., cached_input: _Optional[float] = ...) -> None: ...

class RecordAck(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class Allowance(_message.Message):
    __slots__ = ("run_id", "request_id", "max_cost_usd", "max_tokens", "ttl_s", "exhausted", "detail")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_USD_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    request_id: int
    max_cost_usd: float
    max_tokens: int
    ttl_s: float
    exhausted: bool
    detail: str
    def __init__(self, run_id: _Optional[str] = ..., request_id: _Optional[int] = ..., max_cost_usd: _Optional[float] = ..., max_tokens: _Optional[int] = ..., ttl_s: _Optional[float] = ..., exhausted: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class GuardMessage(_message.Message):
    __slots__ = ("command_id", "sent_at_unix", "welcome", "admit", "deny", "warn", "wrap_up", "cancel", "policy", "record_ack", "allowance", "batch", "reject")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    DENY_FIELD_NUMBER: _ClassVar[int]
    WARN_FIELD_NUMBER: _ClassVar[int]
    WRAP_UP_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RECORD_ACK_FIELD_NUMBER: _ClassVar[int]
    ALLOWANCE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    sent_at_unix: float
    welcome: Welcome
    admit: Admit
    deny: Directive
    warn: Directive
    wrap_up: Directive
    cancel: Directive
    policy: Policy
    record_ack: RecordAck
    allowance: Allowance
    batch: GuardBatch
    reject: Reject
    def __init__(self, command_id: _Optional[int] = ..., sent_at_unix: _Optional[float] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., admit: _Optional[_Union[Admit, _Mapping]] = ..., deny: _Optional[_Union[Directive, _Mapping]] = ..., warn: _Optional[_Union[Directive, _Mapping]] = ..., wrap_up: _Optional[_Union[Directive, _Mapping]] = ..., cancel: _Optional[_Union[Directive, _Mapping]] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., record_ack: _Optional[_Union[RecordAck, _Mapping]] = ..., allowance: _Optional[_Union[Allowance, _Mapping]] = ..., batch: _Optional[_Union[GuardBatch, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("run_id", "body", "code", "reason", "dead_lettered", "request_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    body: str
    code: int
    reason: str
    dead_lettered: bool
    request_id: int
    def __init__(self, run_id: _Optional[str] = ..., body: _Optional[str] = ..., code: _Optional[int] = ..., reason: _Optional[str] = ..., dead_lettered: _Optional[bool] = ..., request_id: _Optional[int] = ...) -> None: ...

class GuardBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[GuardMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[GuardMessage, _Mapping]]] = ...) -> None: ...

class Selector(_message.Message):
    __slots__ = ("run_id", "tenant", "agent", "all")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    tenant: str
    agent: str
    all: bool
    def __init__(self, run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., agent: _Optional[str] = ..., all: _Optional[bool] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("selector", "reason")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    selector: Selector
    reason: str
    def __init__(self, selector: _Optional[_Union[Selector, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("run_ids",)
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("tenant", "agent", "limit", "local")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    agent: str
    limit: int
    local: bool
    def __init__(self, tenant: _Optional[str] = ..., agent: _Optional[str] = ..., limit: _Optional[int] = ..., local: _Optional[bool] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_id", "parent_run_id", "tenant", "agent", "process_id", "usage", "limits", "elapsed_s", "utilisation", "metric", "state", "connected", "guard_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    GUARD_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    parent_run_id: str
    tenant: str
    agent: str
    process_id: str
    usage: Usage
    limits: Limits
    elapsed_s: float
    utilisation: float
    metric: str
    state: str
    connected: bool
    guard_id: str
    def __init__(self, run_id: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., tenant: _Optional[str] = ..., agent: _Optional[str] = ..., process_id: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., elapsed_s: _Optional[float] = ..., utilisation: _Optional[float] = ..., metric: _Optional[str] = ..., state: _Optional[str] = ..., connected: _Optional[bool] = ..., guard_id: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "total")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunStatus]
    total: int
    def __init__(self, runs: _Optional[_Iterable[_Union[RunStatus, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class TenantBudgetsRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class WindowUsage(_message.Message):
    __slots__ = ("metric", "window_s", "used", "limit")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    metric: str
    window_s: float
    used: float
    limit: float
    def __init__(self, metric: _Optional[str] = ..., window_s: _Optional[float] = ..., used: _Optional[float] = ..., limit: _Optional[float] = ...) -> None: ...

class TenantBudget(_message.Message):
    __slots__ = ("tenant", "live_runs", "max_concurrent_runs", "windows", "exhausted")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LIVE_RUNS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_RUNS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    live_runs: int
    max_concurrent_runs: int
    windows: _containers.RepeatedCompositeFieldContainer[WindowUsage]
    exhausted: bool
    def __init__(self, tenant: _Optional[str] = ..., live_runs: _Optional[int] = ..., max_concurrent_runs: _Optional[int] = ..., windows: _Optional[_Iterable[_Union[WindowUsage, _Mapping]]] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class TenantBudgetsResponse(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantBudget]
    def __init__(self, tenants: _Optional[_Iterable[_Union[TenantBudget, _Mapping]]] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("since_unix", "until_unix", "tenant", "agent", "bucket_s")
    SINCE_UNIX_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    BUCKET_S_FIELD_NUMBER: _ClassVar[int]
    since_unix: float
    until_unix: float
    tenant: str
    agent: str
    bucket_s: int
    def __init__(self, since_unix: _Optional[float] = ..., until_unix: _Optional[float] = ..., tenant: _Optional[str] = ..., agent: _Optional[str] = ..., bucket_s: _Optional[int] = ...) -> None: ...

class DistributionRow(_message.Message):
    __slots__ = ("status", "reason", "runs", "steps", "tokens", "cost_usd", "p50_steps", "p95_steps", "p95_cost_usd", "p95_elapsed_ms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    P50_STEPS_FIELD_NUMBER: _ClassVar[int]
    P95_STEPS_FIELD_NUMBER: _ClassVar[int]
    P95_COST_USD_FIELD_NUMBER: _ClassVar[int]
    P95_ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    status: str
    reason: str
    runs: int
    steps: int
    tokens: int
    cost_usd: float
    p50_steps: float
    p95_steps: float
    p95_cost_usd: float
    p95_elapsed_ms: float
    def __init__(self, status: _Optional[str] = ..., reason: _Optional[str] = ..., runs: _Optional[int] = ..., steps: _Optional[int] = ..., tokens: _Optional[int] = ..., cost_usd: _Optional[float] = ..., p50_steps: _Optional[float] = ..., p95_steps: _Optional[float] = ..., p95_cost_usd: _Optional[float] = ..., p95_elapsed_ms: _Optional[float] = ...) -> None: ...

class SeriesPoint(_message.Message):
    __slots__ = ("bucket_start_unix", "status", "reason", "runs", "cost_usd")
    BUCKET_START_UNIX_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    bucket_start_unix: float
    status: str
    reason: str
    runs: int
    cost_usd: float
    def __init__(self, bucket_start_unix: _Optional[float] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., runs: _Optional[int] = ..., cost_usd: _Optional[float] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("rows", "series")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[DistributionRow]
    series: _containers.RepeatedCompositeFieldContainer[SeriesPoint]
    def __init__(self, rows: _Optional[_Iterable[_Union[DistributionRow, _Mapping]]] = ..., series: _Optional[_Iterable[_Union[SeriesPoint, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("guard_id", "figures")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    GUARD_ID_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    guard_id: str
    figures: _containers.ScalarMap[str, float]
    def __init__(self, guard_id: _Optional[str] = ..., figures: _Optional[_Mapping[str, float]] = ...) -> None: ...
