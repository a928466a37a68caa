"""The training function the Ray tests hand to `ElasticRayExecutor.run`.

A small model trained under `hvd.elastic.run`, committing every step. Rank 0 appends what
happens to a log file the test reads: `enter STEP SIZE` each time the training function is
(re-)entered (after a reset, STEP is what was restored) and `commit STEP SIZE` after each commit.
It trains until it has made `steps_at_size` steps at `until_size` workers (or `max_steps` in
all), sleeping `step_time` per step to stand for a step's compute.
"""

from __future__ import annotations

import time


def train(log_path: str, until_size: int, steps_at_size: int = 10, max_steps: int = 3000,
          step_time: float = 0.02) -> dict:
    import torch

    import ringmaster.torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, at_size=0)

    def note(line: str) -> None:
        if hvd.rank() == 0:
            with open(log_path, "a") as file:
                file.write(line + "\n")

    @hvd.elastic.run
    def loop(state) -> None:
        note(f"enter {state.step} {hvd.size()}")
        generator = torch.Generator().manual_seed(1000 + state.step * 64 + hvd.rank())
        while state.at_size < steps_at_size and state.step < max_steps:
            optimizer.zero_grad()
            inputs = torch.randn(16, 8, generator=generator)
            loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
            loss.backward()
            optimizer.step()
            time.sleep(step_time)
            state.step += 1
            state.at_size = state.at_size + 1 if hvd.size() == until_size else 0
            state.commit()
            note(f"commit {state.step} {hvd.size()}")

    loop(state)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    group = hvd.elastic.replica_group()
    return {"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "params": flat.tolist(),
            "group": (group.index, group.count, group.size)}


def fails(message: str) -> None:
    """A training function with a bug: every worker raises at once."""
    raise ValueError(message)
