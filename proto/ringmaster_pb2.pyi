from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SpanKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPAN_UNKNOWN: _ClassVar[SpanKind]
    SPAN_FORWARD: _ClassVar[SpanKind]
    SPAN_BACKWARD: _ClassVar[SpanKind]
    SPAN_ALLREDUCE: _ClassVar[SpanKind]
    SPAN_OPTIMIZER_STEP: _ClassVar[SpanKind]
    SPAN_COMMIT: _ClassVar[SpanKind]
    SPAN_RESTORE: _ClassVar[SpanKind]
    SPAN_SYNC: _ClassVar[SpanKind]
    SPAN_RING_BUILD: _ClassVar[SpanKind]
    SPAN_WAITING: _ClassVar[SpanKind]
SPAN_UNKNOWN: SpanKind
SPAN_FORWARD: SpanKind
SPAN_BACKWARD: SpanKind
SPAN_ALLREDUCE: SpanKind
SPAN_OPTIMIZER_STEP: SpanKind
SPAN_COMMIT: SpanKind
SPAN_RESTORE: SpanKind
SPAN_SYNC: SpanKind
SPAN_RING_BUILD: SpanKind
SPAN_WAITING: SpanKind

class Ack(_message.Message):
    __slots__ = ("ok", "message", "heartbeat_interval_s", "relay_beats")
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    RELAY_BEATS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    message: str
    heartbeat_interval_s: float
    relay_beats: bool
    def __init__(self, ok: _Optional[bool] = ..., message: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., relay_beats: _Optional[bool] = ...) -> None: ...

class Seal(_message.Message):
    __slots__ = ("sequence", "mac")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    mac: bytes
    def __init__(self, sequence: _Optional[int] = ..., mac: _Optional[bytes] = ...) -> None: ...

class AgentHello(_message.Message):
    __slots__ = ("host", "pid", "running", "incarnation", "slots", "carries_events", "version", "shares_events", "shares_places")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    CARRIES_EVENTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARES_EVENTS_FIELD_NUMBER: _ClassVar[int]
    SHARES_PLACES_FIELD_NUMBER: _ClassVar[int]
    host: str
    pid: int
    running: _containers.RepeatedScalarFieldContainer[str]
    incarnation: str
    slots: int
    carries_events: bool
    version: str
    shares_events: bool
    shares_places: bool
    def __init__(self, host: _Optional[str] = ..., pid: _Optional[int] = ..., running: _Optional[_Iterable[str]] = ..., incarnation: _Optional[str] = ..., slots: _Optional[int] = ..., carries_events: _Optional[bool] = ..., version: _Optional[str] = ..., shares_events: _Optional[bool] = ..., shares_places: _Optional[bool] = ...) -> None: ...

class WorkerSpec(_message.Message):
    __slots__ = ("worker_id", "slot", "argv", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    slot: int
    argv: _containers.RepeatedScalarFieldContainer[bytes]
    env: _containers.ScalarMap[str, bytes]
    def __init__(self, worker_id: _Optional[str] = ..., slot: _Optional[int] = ..., argv: _Optional[_Iterable[bytes]] = ..., env: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class AgentCommand(_message.Message):
    __slots__ = ("workers", "shutdown", "reason", "events", "seal")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    SEAL_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerSpec]
    shutdown: bool
    reason: str
    events: _containers.RepeatedCompositeFieldContainer[HostedEvent]
    seal: Seal
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerSpec, _Mapping]]] = ..., shutdown: _Optional[bool] = ..., reason: _Optional[str] = ..., events: _Optional[_Iterable[_Union[HostedEvent, _Mapping]]] = ..., seal: _Optional[_Union[Seal, _Mapping]] = ...) -> None: ...

class HostedEvent(_message.Message):
    __slots__ = ("worker_id", "event", "also", "places")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    PLACES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    event: WorkerEvent
    also: _containers.RepeatedScalarFieldContainer[str]
    places: _containers.RepeatedCompositeFieldContainer[Place]
    def __init__(self, worker_id: _Optional[str] = ..., event: _Optional[_Union[WorkerEvent, _Mapping]] = ..., also: _Optional[_Iterable[str]] = ..., places: _Optional[_Iterable[_Union[Place, _Mapping]]] = ...) -> None: ...

class Place(_message.Message):
    __slots__ = ("rank", "local_rank", "local_size", "cross_rank", "cross_size")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    CROSS_RANK_FIELD_NUMBER: _ClassVar[int]
    CROSS_SIZE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., local_size: _Optional[int] = ..., cross_rank: _Optional[int] = ..., cross_size: _Optional[int] = ...) -> None: ...

class AgentHeartbeatRequest(_message.Message):
    __slots__ = ("host", "workers", "busy")
    HOST_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    host: str
    workers: _containers.RepeatedCompositeFieldContainer[RelayedBeat]
    busy: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[RelayedBeat, _Mapping]]] = ..., busy: _Optional[_Iterable[str]] = ...) -> None: ...

class RelayedBeat(_message.Message):
    __slots__ = ("beat", "age_s")
    BEAT_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    beat: WorkerHeartbeatRequest
    age_s: float
    def __init__(self, beat: _Optional[_Union[WorkerHeartbeatRequest, _Mapping]] = ..., age_s: _Optional[float] = ...) -> None: ...

class CarriedReady(_message.Message):
    __slots__ = ("host", "ready")
    HOST_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    host: str
    ready: _containers.RepeatedCompositeFieldContainer[ReadyRequest]
    def __init__(self, host: _Optional[str] = ..., ready: _Optional[_Iterable[_Union[ReadyRequest, _Mapping]]] = ...) -> None: ...

class CarriedReadyAnswer(_message.Message):
    __slots__ = ("refused",)
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    refused: _containers.RepeatedCompositeFieldContainer[RefusedReady]
    def __init__(self, refused: _Optional[_Iterable[_Union[RefusedReady, _Mapping]]] = ...) -> None: ...

class RefusedReady(_message.Message):
    __slots__ = ("worker_id", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class WorkerExit(_message.Message):
    __slots__ = ("host", "worker_id", "exit_code", "signal", "stopped_by_agent", "output")
    HOST_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STOPPED_BY_AGENT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    host: str
    worker_id: str
    exit_code: int
    signal: int
    stopped_by_agent: bool
    output: str
    def __init__(self, host: _Optional[str] = ..., worker_id: _Optional[str] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., stopped_by_agent: _Optional[bool] = ..., output: _Optional[str] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("host", "deadline_s", "reason", "notice", "withdraw")
    HOST_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NOTICE_FIELD_NUMBER: _ClassVar[int]
    WITHDRAW_FIELD_NUMBER: _ClassVar[int]
    host: str
    deadline_s: float
    reason: str
    notice: bool
    withdraw: bool
    def __init__(self, host: _Optional[str] = ..., deadline_s: _Optional[float] = ..., reason: _Optional[str] = ..., notice: _Optional[bool] = ..., withdraw: _Optional[bool] = ...) -> None: ...

class WorkerHello(_message.Message):
    __slots__ = ("worker_id", "host", "pid", "waiting", "after_generation", "failure", "elastic", "hears_agent")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    AFTER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    HEARS_AGENT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    host: str
    pid: int
    waiting: bool
    after_generation: int
    failure: str
    elastic: bool
    hears_agent: bool
    def __init__(self, worker_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., waiting: _Optional[bool] = ..., after_generation: _Optional[int] = ..., failure: _Optional[str] = ..., elastic: _Optional[bool] = ..., hears_agent: _Optional[bool] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("generation", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "store_host", "store_port", "store_prefix", "hosts_sequence", "ends_generation", "ends_reason")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    CROSS_RANK_FIELD_NUMBER: _ClassVar[int]
    CROSS_SIZE_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    STORE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    HOSTS_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ENDS_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ENDS_REASON_FIELD_NUMBER: _ClassVar[int]
    generation: int
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    store_host: str
    store_port: int
    store_prefix: str
    hosts_sequence: int
    ends_generation: int
    ends_reason: str
    def __init__(self, generation: _Optional[int] = ..., rank: _Optional[int] = ..., size: _Optional[int] = ..., local_rank: _Optional[int] = ..., local_size: _Optional[int] = ..., cross_rank: _Optional[int] = ..., cross_size: _Optional[int] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., store_prefix: _Optional[str] = ..., hosts_sequence: _Optional[int] = ..., ends_generation: _Optional[int] = ..., ends_reason: _Optional[str] = ...) -> None: ...

class GenerationOver(_message.Message):
    __slots__ = ("generation", "reason", "rejoin")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REJOIN_FIELD_NUMBER: _ClassVar[int]
    generation: int
    reason: str
    rejoin: bool
    def __init__(self, generation: _Optional[int] = ..., reason: _Optional[str] = ..., rejoin: _Optional[bool] = ...) -> None: ...

class HostsUpdated(_message.Message):
    __slots__ = ("sequence", "reason", "checkpoint", "placed", "generation")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    reason: str
    checkpoint: bool
    placed: bool
    generation: int
    def __init__(self, sequence: _Optional[int] = ..., reason: _Optional[str] = ..., checkpoint: _Optional[bool] = ..., placed: _Optional[bool] = ..., generation: _Optional[int] = ...) -> None: ...

class HostsAnnounced(_message.Message):
    __slots__ = ("sequence", "reason")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    reason: str
    def __init__(self, sequence: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Retire(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class JobEnded(_message.Message):
    __slots__ = ("success", "reason")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    success: bool
    reason: str
    def __init__(self, success: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class WorkerEvent(_message.Message):
    __slots__ = ("assignment", "generation_over", "hosts_updated", "retire", "job_ended", "hosts_announced", "seal")
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_OVER_FIELD_NUMBER: _ClassVar[int]
    HOSTS_UPDATED_FIELD_NUMBER: _ClassVar[int]
    RETIRE_FIELD_NUMBER: _ClassVar[int]
    JOB_ENDED_FIELD_NUMBER: _ClassVar[int]
    HOSTS_ANNOUNCED_FIELD_NUMBER: _ClassVar[int]
    SEAL_FIELD_NUMBER: _ClassVar[int]
    assignment: Assignment
    generation_over: GenerationOver
    hosts_updated: HostsUpdated
    retire: Retire
    job_ended: JobEnded
    hosts_announced: HostsAnnounced
    seal: Seal
    def __init__(self, assignment: _Optional[_Union[Assignment, _Mapping]] = ..., generation_over: _Optional[_Union[GenerationOver, _Mapping]] = ..., hosts_updated: _Optional[_Union[HostsUpdated, _Mapping]] = ..., retire: _Optional[_Union[Retire, _Mapping]] = ..., job_ended: _Optional[_Union[JobEnded, _Mapping]] = ..., hosts_announced: _Optional[_Union[HostsAnnounced, _Mapping]] = ..., seal: _Optional[_Union[Seal, _Mapping]] = ...) -> None: ...

class ReadyRequest(_message.Message):
    __slots__ = ("worker_id", "after_generation", "failure", "elastic", "awaits_hosts")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_GENERATION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    AWAITS_HOSTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    after_generation: int
    failure: str
    elastic: bool
    awaits_hosts: int
    def __init__(self, worker_id: _Optional[str] = ..., after_generation: _Optional[int] = ..., failure: _Optional[str] = ..., elastic: _Optional[bool] = ..., awaits_hosts: _Optional[int] = ...) -> None: ...

class WorkerHeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "commits", "elastic", "stats", "spans", "spans_dropped", "steps_since_commit")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    SPANS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    STEPS_SINCE_COMMIT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    commits: int
    elastic: bool
    stats: WorkerStats
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    spans_dropped: int
    steps_since_commit: int
    def __init__(self, worker_id: _Optional[str] = ..., commits: _Optional[int] = ..., elastic: _Optional[bool] = ..., stats: _Optional[_Union[WorkerStats, _Mapping]] = ..., spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., spans_dropped: _Optional[int] = ..., steps_since_commit: _Optional[int] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("kind", "start_us", "duration_us", "rank", "generation", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_US_FIELD_NUMBER: _ClassVar[int]
    DURATION_US_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: SpanKind
    start_us: int
    duration_us: int
    rank: int
    generation: int
    detail: int
    def __init__(self, kind: _Optional[_Union[SpanKind, str]] = ..., start_us: _Optional[int] = ..., duration_us: _Optional[int] = ..., rank: _Optional[int] = ..., generation: _Optional[int] = ..., detail: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("count", "seconds", "buckets")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    count: int
    seconds: float
    buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, count: _Optional[int] = ..., seconds: _Optional[float] = ..., buckets: _Optional[_Iterable[int]] = ...) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("commits", "syncs", "rollbacks", "checkpoints_written", "checkpoint_failures", "checkpoint_bytes", "has_loss", "loss", "steps", "wait_seconds", "batch_size", "noise_scale", "global_batch", "micro_batch", "accumulation", "sharing")
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    SYNCS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACKS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_BYTES_FIELD_NUMBER: _ClassVar[int]
    HAS_LOSS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_FIELD_NUMBER: _ClassVar[int]
    ACCUMULATION_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    commits: Timing
    syncs: Timing
    rollbacks: int
    checkpoints_written: int
    checkpoint_failures: int
    checkpoint_bytes: int
    has_loss: bool
    loss: float
    steps: Timing
    wait_seconds: float
    batch_size: int
    noise_scale: float
    global_batch: int
    micro_batch: int
    accumulation: int
    sharing: int
    def __init__(self, commits: _Optional[_Union[Timing, _Mapping]] = ..., syncs: _Optional[_Union[Timing, _Mapping]] = ..., rollbacks: _Optional[int] = ..., checkpoints_written: _Optional[int] = ..., checkpoint_failures: _Optional[int] = ..., checkpoint_bytes: _Optional[int] = ..., has_loss: _Optional[bool] = ..., loss: _Optional[float] = ..., steps: _Optional[_Union[Timing, _Mapping]] = ..., wait_seconds: _Optional[float] = ..., batch_size: _Optional[int] = ..., noise_scale: _Optional[float] = ..., global_batch: _Optional[int] = ..., micro_batch: _Optional[int] = ..., accumulation: _Optional[int] = ..., sharing: _Optional[int] = ...) -> None: ...

class DoneRequest(_message.Message):
    __slots__ = ("worker_id", "commits", "warning", "fatal")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    commits: int
    warning: str
    fatal: str
    def __init__(self, worker_id: _Optional[str] = ..., commits: _Optional[int] = ..., warning: _Optional[str] = ..., fatal: _Optional[str] = ...) -> None: ...
