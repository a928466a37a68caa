"""A job read back from its log: events in both JSON forms, rank 0's figures, what each change cost."""

from __future__ import annotations

import json

from ringmaster.common.job_history import MAX_LINE_CHARS, read_history

T = 1_800_000_000.0


def event(at: float, kind: str, **fields) -> str:
    return json.dumps({"logger": "ringmaster.rendezvous", "level": "INFO", "message": f"{kind} message",
                       "time": T + at, "kind": kind, "generation": None, **fields})


def figure(at: float, step: int, worker: str = "hostA/1", **fields) -> str:
    return f"[{worker}] " + json.dumps({"step": step, "time": T + at, "size": 4, **fields})


def a_log() -> list[str]:
    lines = [event(0.0, "generation.formed", number=1, size=4, cause="job start", causes=[])]
    lines += [figure(0.1 * i, i, loss=2.0 / i) for i in range(1, 11)]  # steps 1..10 by 1.0 s
    lines.append(event(1.05, "worker.failed", worker="hostB/3"))  # (the same fault as the host's loss: folded in)
    lines.append(event(1.05, "host.lost", host="hostB"))
    lines.append(event(1.06, "generation.formed", number=2, size=2, cause="host hostB lost", causes=["host_lost"]))
    lines.append(event(1.07, "hosts.changed", description="removed hostB"))  # (before the recovery is seen)
    lines += [figure(1.5 + 0.1 * i, 9 + i, loss=0.1) for i in range(0, 6)]  # steps 9, 10 again, then 11..14
    lines.append(event(1.55, "job.recovered", seconds=0.5, number=2))
    lines.append(event(2.3, "scale.requested", np=4))
    lines.append(event(2.45, "generation.formed", number=3, size=4, cause="scaled to 4", causes=["scale"]))
    lines += [figure(2.5 + 0.1 * i, 15 + i, loss=0.05) for i in range(3)]
    lines.append(figure(2.8, 17, epoch=1, accuracy=0.93))
    return lines


def test_events_figures_generations_and_what_each_change_cost() -> None:
    history = read_history(a_log())
    assert history.t0 == T and history.skipped == 0
    assert [(g.number, g.size,
             g.causes) for g in history.generations] == [(1, 4, ()), (2, 2, ("host_lost",)), (3, 4, ("scale",))]
    assert history.final_accuracy() == 0.93
    fault, removed, scale = history.disruptions()
    assert removed.kind == "hosts.changed" and removed.recovered_s is None
    assert fault.kind == "host.lost" and fault.recovered_s == 0.5
    assert fault.steps_redone == 2  # steps 9 and 10, trained before the loss, trained again after it
    assert abs(fault.pause_s - 0.5) < 1e-6  # from step 10 at 1.0 s to step 9 again at 1.5 s
    assert scale.kind == "scale.requested" and scale.recovered_s is None and scale.steps_redone == 0
    assert abs(scale.pause_s - 0.5) < 1e-6  # the last step before it at 2.0 s, the next at 2.5 s


def test_the_apis_event_form_reads_the_same() -> None:
    """`ringmaster events --json` keeps the fields apart, under "fields"."""
    record = {"seq": 0, "kind": "generation.formed", "level": "INFO", "generation": 1, "time": T, "message": "m",
              "fields": {"number": 1, "size": 3, "cause": "job start", "causes": []}}
    (gen,) = read_history([json.dumps(record)]).generations
    assert (gen.number, gen.size) == (1, 3)


def test_a_log_is_input_bad_lines_cost_only_themselves() -> None:
    hostile = [
        "x" * (MAX_LINE_CHARS + 1),
        "not json at all",
        json.dumps({"kind": "generation.formed", "time": "yesterday"}),  # no usable time
        json.dumps({"kind": "generation.formed", "time": float("nan")}).replace("NaN", "1e999"),
        json.dumps([1, 2, 3]),
        "[hostA/1] " + json.dumps({"step": "9", "time": T, "loss": 1.0}),  # a step that is not a number
        "[hostA/1] " + json.dumps({"step": 3, "time": T, "loss": "low"}),  # nothing to draw
        "[hostA/1] plain output of the script",
        "[../../etc] " + json.dumps({"step": 3, "time": T, "loss": 1.0}),  # not a worker's name
        event(0.0, "generation.formed", number="one", size=None, cause=["x"], causes="scale"),
    ]
    history = read_history([*hostile, *a_log()])
    assert len(history.generations) == 4  # the bad one is read with its bad fields emptied
    assert history.generations[0].number == 0 and history.generations[0].causes == ()
    assert history.skipped == 6
    assert len(history.disruptions()) == 3
    assert read_history([]).generations == [] and read_history([]).final_accuracy() is None


def test_a_gap_in_which_the_script_waited_on_purpose_is_no_pause_of_the_change() -> None:
    """`examples/digits.py` holds before its last epoch (a `waiting` record) while `ringmaster demo`
    scales the job: the hold is the script's, so the scale's pause is not measured from it."""
    lines = [event(0.0, "generation.formed", number=1, size=4, cause="job start", causes=[])]
    lines += [figure(0.1 * i, i, loss=1.0) for i in range(1, 6)]
    lines.append(figure(0.55, 5, epoch=1, waiting=True))
    lines.append(event(2.0, "scale.requested", np=2))
    lines.append(event(2.1, "generation.formed", number=2, size=2, cause="scaled to 2", causes=["scale"]))
    lines += [figure(7.0 + 0.1 * i, 6 + i, loss=1.0) for i in range(3)]  # the hold ended at 7.0 s
    history = read_history(lines)
    assert [round(w, 3) for w in history.waits] == [0.55]
    (scale,) = history.disruptions()
    assert scale.pause_s is None, scale  # without the record: 6.5 s, the hold's length
    assert abs(read_history([line for line in lines if "waiting" not in line]).disruptions()[0].pause_s - 6.5) < 1e-6


def test_a_log_of_many_waits_and_steps_is_read_in_time_linear_in_its_length() -> None:
    """A log is input (`ringmaster plot` reads any): 20,000 steps and as many `waiting` records
    between them, then a scale whose pause spans them all. Each gap is looked up, not scanned
    (a scan of every wait for every gap: 4 x 10^8 comparisons, minutes)."""
    import time

    n = 20_000
    lines = [event(0.0, "generation.formed", number=1, size=4, cause="job start", causes=[])]
    lines.append(event(0.001, "scale.requested", np=2))
    for i in range(1, n + 1):
        lines.append(figure(0.01 * i, i, loss=1.0))
        lines.append(figure(0.01 * i + 0.005, i, waiting=True))
    lines.append(event(0.01 * n + 1, "generation.formed", number=2, size=2, cause="scaled to 2", causes=["scale"]))
    lines.append(figure(0.01 * n + 2, n + 1, loss=1.0))
    history = read_history(lines)
    started = time.process_time()
    (scale,) = history.disruptions()
    assert scale.pause_s is None  # every gap holds a wait
    assert time.process_time() - started < 2
