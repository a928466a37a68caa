"""What a host's pool agent and the pool say to each other (`POST /hosts/{name}/poll`): strict
pydantic models, bounded, used by both sides, so a field that one side does not know or a value
out of range is refused rather than guessed at."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from ringmaster.settings import MAX_SLOTS_PER_HOST

#: Seconds the pool holds a poll open when nothing changes for its host (the agent's client waits
#: longer than this for an answer).
POLL_HOLD_S = 5.0
#: Most job agents one poll reports (running or ended) and most orders one answer carries.
MAX_ITEMS = 1024
#: Longest order name (a job id, '@', a rendezvous address).
MAX_ORDER_CHARS = 600


class EndedAgent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order: StrictStr = Field(max_length=MAX_ORDER_CHARS)
    how: StrictStr = Field(max_length=2000, description="how the job's agent ended (its exit code, its last lines)")


class PollRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session: Optional[StrictStr] = Field(None, max_length=64, description="as the last answer gave it; none to join")
    slots: StrictInt = Field(ge=1, le=MAX_SLOTS_PER_HOST, description="workers this host runs at once")
    version: StrictInt = Field(-1, ge=-1, le=2**62, description="of the orders it holds; the answer waits for another")
    applied: StrictInt = Field(-1, ge=-1, le=2**62, description="the version of the orders it has acted on")
    running: list[StrictStr] = Field(default_factory=list, max_length=MAX_ITEMS,
                                     description="orders whose job agent runs here")
    ended: list[EndedAgent] = Field(default_factory=list, max_length=MAX_ITEMS)
    pid: Optional[StrictInt] = Field(None, ge=1, le=2**31, description="the pool agent's process id (for operators)")
    resources: dict[StrictStr, Union[StrictInt, StrictFloat]] = Field(
        default_factory=dict, max_length=8, description="what this host has besides slots: gpu, cpu")


class OrderRow(BaseModel):
    """Run one job's agent on this host (`ringmaster agent --from-launcher` with these)."""

    model_config = ConfigDict(extra="forbid")
    order: StrictStr = Field(max_length=MAX_ORDER_CHARS)
    job: StrictStr = Field(max_length=300)
    rendezvous: StrictStr = Field(max_length=300)
    key: StrictStr = Field(min_length=64, max_length=64, description="this host's agent key for the job (hex)")
    heartbeat_interval_s: StrictFloat = Field(gt=0, le=3600)
    stop_grace_s: StrictFloat = Field(ge=0, le=86_400)
    reconnect_timeout_s: Optional[StrictFloat] = Field(None, ge=0, le=86_400)
    spares: Optional[StrictInt] = Field(None, ge=0, le=1024)
    drain_grace_s: Optional[StrictFloat] = Field(None, ge=0, le=86_400)
    gpus_per_worker: StrictFloat = Field(0.0, ge=0, le=1e6, description="0: the job's workers see no GPU")


class PollAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session: StrictStr
    version: StrictInt
    hold_s: StrictFloat = Field(description="how long the pool holds a poll open when nothing changes")
    timeout_s: StrictFloat = Field(description="a host that has not polled for this long leaves the pool")
    orders: list[OrderRow] = Field(max_length=MAX_ITEMS)


class LeaveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session: StrictStr = Field(max_length=64)
