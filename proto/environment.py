"""The environment a worker process is started with: part of the contract, like the .proto.

Ringmaster's own variables tell the worker library where the rendezvous and the store are.
Horovod's worker variables (HOROVOD_RANK, HOROVOD_SIZE, ..., HOROVOD_HOSTNAME) are set as
horovodrun sets them: the slot's place when the process starts (a newcomer's is where it is
expected to join); `hvd.rank()` and friends give the current values after every reset.
The torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, ...) let a plain `torch.distributed` script run unchanged.
"""

RENDEZVOUS = "RINGMASTER_RENDEZVOUS"  # host:port of the rendezvous gRPC service (comma-separated with standbys)
RECONNECT_TIMEOUT = "RINGMASTER_RECONNECT_TIMEOUT"  # seconds a worker keeps trying to reach a lost rendezvous
WORKER_ID = "RINGMASTER_WORKER_ID"  # this process' identity in the job
HOST = "RINGMASTER_HOST"  # the (possibly emulated) host name the worker runs on
STORE = "RINGMASTER_STORE"  # host:port of the long-lived TCPStore that elastic rebuilds use
GENERATION = "RINGMASTER_GENERATION"  # generation the worker starts in; 0 for a warming newcomer
COLLECTIVE_TIMEOUT = "RINGMASTER_COLLECTIVE_TIMEOUT"  # seconds, see JobSettings
HEARTBEAT_INTERVAL = "RINGMASTER_HEARTBEAT_INTERVAL"  # seconds
BACKEND = "RINGMASTER_BACKEND"  # "gloo" or "nccl"; set by the user to override the default
CHECKPOINT_DIR = "RINGMASTER_CHECKPOINT_DIR"  # folder of durable checkpoints; unset: none
CHECKPOINT_EVERY = "RINGMASTER_CHECKPOINT_EVERY"  # write one every N commits
CHECKPOINT_INTERVAL = "RINGMASTER_CHECKPOINT_INTERVAL"  # or every T seconds
CHECKPOINT_KEEP = "RINGMASTER_CHECKPOINT_KEEP"  # checkpoints kept on disk
CHECKPOINT_TRUSTED = "RINGMASTER_CHECKPOINT_TRUSTED"  # "1": load checkpoints as full pickles (trusted folder)
TIMELINE_SPANS = "RINGMASTER_TIMELINE_SPANS"  # "1": record timeline spans, sent with heartbeats (--timeline)
GROUP_SIZE = "RINGMASTER_GROUP_SIZE"  # workers per replica group (--group-size); ranks gK..gK+K-1 are group g
FUSION_THRESHOLD = "RINGMASTER_FUSION_THRESHOLD"  # bytes fused into one buffer (--fusion-threshold-mb)
# A folder of the agent's where it marks a worker (a file named by its pid) before it sends that
# worker SIGTERM itself; an unmarked SIGTERM came to the whole host (a drain): see host_signals.py.
AGENT_STOPS = "RINGMASTER_AGENT_STOPS"
# A folder of the agent's where a large job's workers send their heartbeats for the agent to carry
# (ringmaster/common/beat_relay.py).
AGENT_BEATS = "RINGMASTER_AGENT_BEATS"
# The agent's pid: a worker forked from the agent's template (worker/agent/starting/template_process.py) has the
# template for its parent, so the messages its agent hands it are told apart by this pid.
AGENT_PID = "RINGMASTER_AGENT_PID"

# The workers' intra-op threads where the user did not set them (worker/agent/starting/threads.py), and the
# flag a launcher sets in an agent whose host is emulated on a machine other agents share.
THREADS = "OMP_NUM_THREADS"
SHARED_MACHINE = "RINGMASTER_SHARED_MACHINE"

GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"  # the interface Gloo rings use (--network-interface)
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"  # the interface NCCL bootstraps on (--network-interface)

TORCHRUN_RANK = "RANK"
TORCHRUN_WORLD_SIZE = "WORLD_SIZE"
TORCHRUN_LOCAL_RANK = "LOCAL_RANK"
TORCHRUN_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
TORCHRUN_GROUP_RANK = "GROUP_RANK"
TORCHRUN_MASTER_ADDR = "MASTER_ADDR"
TORCHRUN_MASTER_PORT = "MASTER_PORT"
TORCHRUN_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHRUN_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"

HOROVOD_HOSTNAME = "HOROVOD_HOSTNAME"
HOROVOD_RANK = "HOROVOD_RANK"
HOROVOD_SIZE = "HOROVOD_SIZE"
HOROVOD_LOCAL_RANK = "HOROVOD_LOCAL_RANK"
HOROVOD_LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
HOROVOD_CROSS_RANK = "HOROVOD_CROSS_RANK"
HOROVOD_CROSS_SIZE = "HOROVOD_CROSS_SIZE"
