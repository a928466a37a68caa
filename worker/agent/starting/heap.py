"""A worker's C heap keeps the memory it frees, for the next step to take again.

glibc gives large blocks back to the kernel as soon as they are freed (those over its mmap
threshold at once, the top of the heap once it passes the trim threshold), and the next
allocation of the same size faults every page in again, zeroed by the kernel. A training step
frees and allocates the same large blocks each time (FSDP2's unsharded parameters and gradients,
activations, the optimizer's temporaries): measured in `bench/sharded.py`'s workers (2 groups of
2, 21 M parameters, Gloo), 25,000-55,000 page faults and 0.14-0.2 s of system time in every step
of plain FSDP2 under torchrun, a quarter of each worker's CPU. With mmap off, the heap never
trimmed and one arena (threads' own arenas give their heaps back whole: 8,200 faults a step
remained with mmap and trimming off alone), the steady step faults no pages and its system time
is Gloo's sockets alone.

So a worker's environment says so to glibc (its `MALLOC_*` variables, read as the process
starts: the agent's template and spares are started with them, so workers forked from them
have the setting as fresh ones do). The cost is that a worker keeps its highest heap: memory it
freed is reused, not returned while it runs (peak memory measured 0-7% higher). A user who set
any `MALLOC_*` variable or glibc's malloc tunables keeps exactly those; `RINGMASTER_HEAP=system`
keeps glibc's defaults. Other C libraries ignore the variables.
"""

from __future__ import annotations

from typing import Mapping

#: Where a user says to keep glibc's defaults: `RINGMASTER_HEAP=system`.
HEAP_ENV = "RINGMASTER_HEAP"

#: The variables a worker gets: no mmap'd blocks, the heap's top never trimmed (64 GiB), one arena.
KEEP_FREED = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(64 << 30), "MALLOC_ARENA_MAX": "1"}


#: The values `RINGMASTER_HEAP` takes: `system` (glibc's defaults) or unset (the settings above).
HEAP_CHOICES = ("system",)


def _choice(env: Mapping[str, str]) -> str:
    """`RINGMASTER_HEAP` as said ("" where unset), read alike by the check and the settings."""
    return env.get(HEAP_ENV, "").strip().lower()


def heap_choice_error(env: Mapping[str, str]) -> str | None:
    """What is wrong with `RINGMASTER_HEAP` in `env`, if anything (a typo would otherwise keep the
    settings on in silence: `ringmaster run` and `ringmaster agent` refuse it)."""
    if _choice(env) in ("", *HEAP_CHOICES):
        return None
    return (f"{HEAP_ENV}={env[HEAP_ENV][:40]!r} is not a heap choice: give {HEAP_ENV}=system to keep glibc's "
            "default heap in workers, or unset it for Ringmaster's (a worker keeps the memory it frees)")


def heap_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to a worker's environment `env` (empty where its user chose)."""
    if _choice(env) == "system":
        return {}
    if any(name.startswith("MALLOC_") for name in env) or "malloc" in env.get("GLIBC_TUNABLES", ""):
        return {}
    return dict(KEEP_FREED)
