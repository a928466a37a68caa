"""A pool job's launcher on hosts that joined by connecting: its agents are orders on the pool's
`HostBoard`, which each host's pool agent carries out (it starts the job's agent with the key of
the order). The job's rendezvous sees a launcher like any other (`Launcher`)."""

from __future__ import annotations

import time

from ringmaster.common.keys import agent_key
from ringmaster.launch.launchers import AgentOptions, Launcher
from ringmaster.rendezvous.pool.host_board import HostBoard, Order

#: Seconds between two looks at the board while `stop_all` waits for the job's agents to end.
_STOP_POLL_S = 0.05


class BoardLauncher(Launcher):
    starts_agents = True

    def __init__(self, board: HostBoard, job: str, options: AgentOptions, secret: str | None,
                 gpus_per_worker: float = 0.0) -> None:
        if secret is None:
            raise ValueError("a pool job has a secret: its agents' keys derive from it")
        self._board, self._job, self._options, self._secret = board, job, options, secret
        self._gpus_per_worker = gpus_per_worker
        self._run = Order(job, options, "").run  # what the board knows this run's orders by
        self._attempts: dict[str, int] = {}  # host -> orders given there
        self._ordered: set[str] = set()  # hosts whose agent has not ended yet

    def start(self, host: str) -> None:
        """Order the job's agent on `host`, unless one ordered there has not ended (as a local
        launcher does not start a second agent for a host); a later start is a new attempt."""
        if host in self._ordered:
            return
        self._attempts[host] = self._attempts.get(host, 0) + 1
        self._ordered.add(host)
        self._board.order(host,
                          Order(self._job, self._options, agent_key(self._secret, host).hex(), self._attempts[host],
                                      self._gpus_per_worker))

    def stop(self, host: str) -> None:
        self._board.withdraw(host, self._run)

    def ended(self) -> list[tuple[str, str]]:
        out = self._board.take_ended(self._run)
        for host, _ in out:
            self._ordered.discard(host)
        return out

    def alive(self) -> int:
        return self._board.running(self._run)

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """Withdraw every order of the job; wait up to `timeout_s` for the hosts' agents to say
        its agents ended (a host that does not say so is lost to the board in time)."""
        self._board.withdraw_all(self._run)
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(_STOP_POLL_S)
        self._board.forget(self._run)
