"""What Slurm says of the engines' job, read and waited on (nbspawn.cluster._batch): the real
scheduler runs in tests/cluster/test_cluster_slurm.py; here the reading and the waiting's rules, with
the scheduler's answers and the engines' registrations given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nbspawn.cluster._batch import JobLook, JobState, asked_engines, lost_words, parse_job, wait_for_engines
from nbspawn.errors import SpawnUsageError

# what Slurm 22.05's ``scontrol show job -o`` printed for a queued job (shortened)
PENDING = (
    "JobId=3 JobName=ipengine-1764-abc UserId=root(0) GroupId=root(0) Priority=1 JobState=PENDING "
    "Reason=Resources Dependency=(null) Requeue=1 Restarts=0 NumNodes=2 NumCPUs=2"
)


def test_scontrols_line_gives_the_state_and_slurms_reason():
    assert parse_job("3", PENDING) == JobState("3", "PENDING", "Resources")
    state = parse_job("3", "JobId=3 JobState=CANCELLED Reason=None Dependency=(null)")
    assert state == JobState("3", "CANCELLED", "") and state.ended
    assert lost_words(state) == "its Slurm job 3 was CANCELLED"
    assert parse_job("3", "slurm_load_jobs error: Invalid job id specified") is None
    assert not parse_job("3", PENDING).ended and parse_job("3", PENDING).words() == "Slurm job 3 is PENDING (Resources)"


def test_a_job_is_asked_once_and_only_an_ended_one_counts():
    asked = []

    def ask(job):
        asked.append(job)
        return {"7": JobState("7", "TIMEOUT", ""), "8": JobState("8", "RUNNING", "")}.get(job)

    look = JobLook(ask)
    assert look.ended("7") == JobState("7", "TIMEOUT", "") and look.ended("7") is not None
    assert look.ended("8") is None and look.ended("9") is None and look.ended(None) is None
    assert asked == ["7", "8", "9"]


def _cluster(*launchers):
    return SimpleNamespace(engines={f"set{i}": launcher for i, launcher in enumerate(launchers)})


def test_the_engines_asked_for_are_those_of_running_engine_sets():
    running = SimpleNamespace(n=2, job_id="5", state="running")
    stopped = SimpleNamespace(n=4, job_id="4", state="after")
    local = SimpleNamespace(n=3, state="running")  # no batch job
    assert asked_engines(_cluster(running, stopped, local)) == (5, ["5"])
    assert asked_engines(SimpleNamespace()) == (0, [])


class _Clock:
    def __init__(self, client, registers_at: float | None, interrupt_at: float | None = None):
        self.t, self.client, self.registers_at, self.interrupt_at = 0.0, client, registers_at, interrupt_at

    def now(self):
        return self.t

    def sleep(self, s):
        self.t += s
        if self.interrupt_at is not None and self.t >= self.interrupt_at:
            raise KeyboardInterrupt
        if self.registers_at is not None and self.t >= self.registers_at:
            self.client.ids = [0, 1]


def test_waiting_says_the_jobs_state_when_it_changes_then_returns_once_every_engine_registered():
    client = SimpleNamespace(ids=[])
    clock = _Clock(client, registers_at=5.0)
    states = iter([JobState("5", "PENDING", "Priority")] * 2 + [JobState("5", "PENDING", "Resources")] * 10)
    said: list[str] = []
    cluster = _cluster(SimpleNamespace(n=2, job_id="5", state="running"))
    wait_for_engines("c", cluster, client, say=said.append, ask=lambda job: next(states), clock=clock.now, sleep=clock.sleep)
    assert said == [
        "nbspawn: waiting for the engines of c (0 of 2 registered): Slurm job 5 is PENDING (Priority)",
        "nbspawn: waiting for the engines of c (0 of 2 registered): Slurm job 5 is PENDING (Resources)",
    ]
    assert client.ids == [0, 1]


def test_nothing_is_waited_for_or_asked_when_the_engines_are_there():
    client = SimpleNamespace(ids=[0, 1])
    cluster = _cluster(SimpleNamespace(n=2, job_id="5", state="running"))
    wait_for_engines("c", cluster, client, say=pytest.fail, ask=pytest.fail)


def test_an_ended_job_or_an_interrupt_is_one_line_saying_what_slurm_said():
    cluster = _cluster(SimpleNamespace(n=2, job_id="5", state="running"))
    client = SimpleNamespace(ids=[])
    clock = _Clock(client, registers_at=None)
    with pytest.raises(
        SpawnUsageError,
        match=r"engines' Slurm job 5 is CANCELLED and will not start them; start them again: c.start_engines_sync\(\)",
    ):
        wait_for_engines(
            "c",
            cluster,
            client,
            say=lambda s: None,
            ask=lambda j: JobState(j, "CANCELLED", ""),
            clock=clock.now,
            sleep=clock.sleep,
        )
    clock = _Clock(client, registers_at=None, interrupt_at=3.0)
    with pytest.raises(SpawnUsageError) as caught:
        wait_for_engines(
            "c",
            cluster,
            client,
            say=lambda s: None,
            ask=lambda j: JobState(j, "PENDING", "Resources"),
            clock=clock.now,
            sleep=clock.sleep,
        )
    assert str(caught.value) == (
        "--cluster c: interrupted while waiting for its engines (0 of 2 registered; Slurm job 5 is PENDING (Resources)); "
        "nothing was started. c.stop_engines_sync() takes them out of the queue"
    )


def test_a_job_seen_completing_is_asked_again_for_how_it_ended(monkeypatch):
    """scancel: the ranks die while Slurm still says COMPLETING (seen in CI); the state it ends in is
    what the user is told."""
    from nbspawn.cluster import _batch

    answers = iter(["JobState=COMPLETING Reason=None", "JobState=COMPLETING Reason=None", "JobState=CANCELLED Reason=None"])
    monkeypatch.setattr(_batch, "_ask_scontrol", lambda job: parse_job(job, next(answers)))
    monkeypatch.setattr(_batch.time, "sleep", lambda s: None)
    assert _batch.job_state("1") == JobState("1", "CANCELLED", "")
