"""The environment a worker process is started with (names in `proto/environment.py`)."""

from __future__ import annotations

from ringmaster.proto import environment as env_names
from ringmaster.rendezvous.control.assignment import RankAssignment
from ringmaster.settings import JobSettings


def base_env(worker_id: str, host: str, slot: int, rendezvous: str, store: str,
             settings: JobSettings) -> dict[str, str]:
    """What every worker needs to find the rendezvous and the store. A newcomer (generation 0)
    gets its rank when it joins; LOCAL_RANK is its slot until then."""
    env = {
        env_names.RENDEZVOUS: rendezvous,
        env_names.WORKER_ID: worker_id,
        env_names.HOST: host,
        env_names.STORE: store,
        env_names.GENERATION: "0",
        env_names.COLLECTIVE_TIMEOUT: str(settings.collective_timeout_s),
        env_names.HEARTBEAT_INTERVAL: str(settings.heartbeat_interval_s),
        env_names.RECONNECT_TIMEOUT: str(settings.reconnect_timeout_s),
        env_names.TORCHRUN_LOCAL_RANK: str(slot),
        env_names.HOROVOD_HOSTNAME: host,
        env_names.HOROVOD_LOCAL_RANK: str(slot),
    }
    if settings.group_size > 1:
        env[env_names.GROUP_SIZE] = str(settings.group_size)
    if settings.timeline:
        env[env_names.TIMELINE_SPANS] = "1"
    if settings.fusion_threshold_bytes is not None:
        env[env_names.FUSION_THRESHOLD] = str(settings.fusion_threshold_bytes)
    if settings.checkpoint_dir:
        env[env_names.CHECKPOINT_DIR] = settings.checkpoint_dir
        env[env_names.CHECKPOINT_KEEP] = str(settings.checkpoint_keep)
        if settings.checkpoint_trusted:
            env[env_names.CHECKPOINT_TRUSTED] = "1"
        if settings.checkpoint_every is not None:
            env[env_names.CHECKPOINT_EVERY] = str(settings.checkpoint_every)
        if settings.checkpoint_interval_s is not None:
            env[env_names.CHECKPOINT_INTERVAL] = str(settings.checkpoint_interval_s)
    return env


def rank_env(a: RankAssignment, generation: int, master_host: str, master_port: int) -> dict[str, str]:
    """torchrun's contract for a worker started into `generation` with assignment `a`.

    TORCHELASTIC_USE_AGENT_STORE makes `init_process_group("env://")` a client of the store at
    MASTER_ADDR:MASTER_PORT (a fresh one per planned generation) instead of hosting one on rank 0.
    """
    return {
        env_names.GENERATION: str(generation),
        env_names.TORCHRUN_RANK: str(a.rank),
        env_names.TORCHRUN_WORLD_SIZE: str(a.size),
        env_names.TORCHRUN_LOCAL_RANK: str(a.local_rank),
        env_names.TORCHRUN_LOCAL_WORLD_SIZE: str(a.local_size),
        env_names.TORCHRUN_GROUP_RANK: str(a.cross_rank),
        env_names.TORCHRUN_MASTER_ADDR: master_host,
        env_names.TORCHRUN_MASTER_PORT: str(master_port),
        env_names.TORCHRUN_RESTART_COUNT: str(generation - 1),
        env_names.TORCHRUN_USE_AGENT_STORE: "True",
        env_names.HOROVOD_RANK: str(a.rank),
        env_names.HOROVOD_SIZE: str(a.size),
        env_names.HOROVOD_LOCAL_RANK: str(a.local_rank),
        env_names.HOROVOD_LOCAL_SIZE: str(a.local_size),
        env_names.HOROVOD_CROSS_RANK: str(a.cross_rank),
        env_names.HOROVOD_CROSS_SIZE: str(a.cross_size),
    }


def tentative_rank_env(a: RankAssignment) -> dict[str, str]:
    """A newcomer's likely place in the ring it is expected to join: `hvd.rank()`/`hvd.size()`
    before it joins, and Horovod's HOROVOD_* start values."""
    return {
        env_names.TORCHRUN_RANK: str(a.rank), env_names.TORCHRUN_WORLD_SIZE: str(a.size),
        env_names.HOROVOD_RANK: str(a.rank), env_names.HOROVOD_SIZE: str(a.size),
        env_names.HOROVOD_LOCAL_RANK: str(a.local_rank), env_names.HOROVOD_LOCAL_SIZE: str(a.local_size),
        env_names.HOROVOD_CROSS_RANK: str(a.cross_rank), env_names.HOROVOD_CROSS_SIZE: str(a.cross_size),
    }


_EXAMPLE = RankAssignment("h/1", "h", 0, 1, 0, 1, 0, 1)
#: The variables that say a worker's place in a generation (all else comes from the job's settings).
RANK_ENV_NAMES = frozenset(rank_env(_EXAMPLE, 1, "h", 1)) | frozenset(tentative_rank_env(_EXAMPLE))
