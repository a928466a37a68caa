"""Hosts from a Slurm allocation: node names, per-node slots from Slurm's variables, node states."""

from __future__ import annotations

import pytest

from ringmaster.discovery import DiscoveryError
from ringmaster.discovery.slurm import SlurmDiscovery, parse_node_names, slots_of_nodes, tasks_per_node, usable_nodes
from ringmaster.launch.launch_plan import choose_launcher, srun_command

NODES = ["n1", "n2", "n3"]


@pytest.mark.parametrize("value, counts", [("2", [2]), ("2(x3)", [2, 2, 2]), ("2(x2),1", [2, 2, 1]),
                                           (" 4 , 1(x2)", [4, 1, 1])])
def test_tasks_per_node_expands_slurms_compressed_form(value, counts) -> None:
    assert tasks_per_node(value) == counts


@pytest.mark.parametrize("value", ["two", "2(x)", "2x3", "-1", "2(x3", "1(x99999)"])
def test_a_tasks_per_node_that_is_not_slurms_is_refused_naming_it(value) -> None:
    with pytest.raises(DiscoveryError, match="SLURM_TASKS_PER_NODE"):
        tasks_per_node(value)


def test_slots_come_from_the_flag_then_gpus_then_tasks_per_node() -> None:
    env = {"SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "8", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    assert slots_of_nodes(NODES, env, 3) == {"n1": 3, "n2": 3, "n3": 3}
    assert slots_of_nodes(NODES, env, None) == {"n1": 4, "n2": 4, "n3": 4}
    del env["SLURM_GPUS_ON_NODE"]
    assert slots_of_nodes(NODES, env, None) == {"n1": 8, "n2": 8, "n3": 8}
    del env["SLURM_NTASKS_PER_NODE"]
    assert slots_of_nodes(NODES, env, None) == {"n1": 2, "n2": 2, "n3": 1}
    assert slots_of_nodes(NODES, {}, None) == {"n1": 1, "n2": 1, "n3": 1}


@pytest.mark.parametrize("env, named", [({"SLURM_GPUS_ON_NODE": "0"}, "SLURM_GPUS_ON_NODE"),
                                        ({"SLURM_NTASKS_PER_NODE": "lots"}, "SLURM_NTASKS_PER_NODE"),
                                        ({"SLURM_TASKS_PER_NODE": "2(x2)"}, "counts 2 nodes")])
def test_slot_counts_that_make_no_sense_are_refused_naming_the_variable(env, named) -> None:
    with pytest.raises(DiscoveryError, match=named):
        slots_of_nodes(NODES, env, None)


def test_node_names_from_scontrol_are_checked_as_host_names() -> None:
    assert parse_node_names("n1\nn2\n\n") == ["n1", "n2"]
    with pytest.raises(DiscoveryError, match="no node"):
        parse_node_names("\n")
    with pytest.raises(DiscoveryError, match="not a valid host name"):
        parse_node_names("n1\nbad name;rm -rf\n")


def test_down_drained_failed_and_silent_nodes_are_left_out_with_their_state() -> None:
    sinfo = "n1 alloc\nn2 drng\nn3 mix*\nother idle\n"
    usable, why = usable_nodes(sinfo, NODES)
    assert usable == ["n1"] and why == {"n2": "drng", "n3": "mix*"}
    usable, why = usable_nodes("n1 idle\nn2 down\n", NODES)
    assert usable == ["n1"] and why == {"n2": "down", "n3": "not listed by sinfo"}
    assert usable_nodes("n1 mix\nn2 comp\nn3 alloc\n", NODES)[0] == NODES


def test_outside_an_allocation_slurm_discovery_says_what_to_do() -> None:
    with pytest.raises(DiscoveryError, match="sbatch script or salloc"):
        SlurmDiscovery({}, None)


def test_agents_are_slurm_steps_and_slurm_is_chosen_inside_a_slurm_job() -> None:
    argv = srun_command("n2", ["python", "-m", "ringmaster.worker.agent"], ("--mem=0",))
    assert argv[:6] == ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--nodelist=n2", "--kill-on-bad-exit=0"]
    assert argv[-4:] == ["--mem=0", "python", "-m", "ringmaster.worker.agent"]
    assert choose_launcher(None, {"SLURM_JOB_ID": "42"}) == "slurm"
    assert choose_launcher("local", {"SLURM_JOB_ID": "42"}) == "local"
    assert choose_launcher(None, {"SLURM_JOB_ID": "42", "RINGMASTER_LAUNCHER": "ssh"}) == "ssh"
    assert choose_launcher(None, {}) == "ssh"


def test_the_sbatch_example_asks_slurm_for_what_elasticity_needs_and_its_flags_parse() -> None:
    import pathlib
    import shlex

    from ringmaster.cli.main import build_parser

    text = (pathlib.Path(__file__).resolve().parents[3] / "examples" / "slurm" / "train.sbatch").read_text()
    directives = [line.split(None,
                             1)[1].split("#")[0].strip() for line in text.splitlines() if line.startswith("#SBATCH")]
    for needed in ("--no-kill", "--requeue", "--signal=B:USR1@90", "--open-mode=append"):
        assert needed in directives
    command = text[text.index("exec ringmaster run"):].replace("\\\n", " ").splitlines()[0]
    argv = shlex.split(command.replace("$", "").replace("SLURM_JOB_NAME", "job"))[2:]
    parsed, unknown = build_parser().parse_known_args(argv)
    assert not unknown and parsed.verb == "run" and parsed.checkpoint_dir and parsed.launcher is None
