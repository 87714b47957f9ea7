"""Unit test of how a kept world's rank tells an interrupt meant for the job it begins from one meant
for a job that had ended (``ranks._worldloop``): the kernel sends ``(INTERRUPT, seq)`` on the rank's
pipe just before SIGINT, which an idle rank ignores.  A real pipe, no processes."""

from __future__ import annotations

import multiprocessing

import pytest

from nbspawn.ranks import _worldloop
from nbspawn.ranks._worldloop import INTERRUPT, _interrupted_before_start, _next_message


@pytest.fixture
def pipe():
    kernel, rank = multiprocessing.Pipe()
    yield kernel, rank
    _worldloop._later.clear()
    kernel.close()
    rank.close()


def test_an_interrupt_for_the_job_being_begun_is_found(pipe):
    kernel, rank = pipe
    kernel.send((INTERRUPT, 7))
    assert _interrupted_before_start(rank, 7)
    assert not rank.poll(0)  # read: the next job's start does not see it again


def test_interrupts_for_jobs_that_had_ended_are_dropped(pipe):
    kernel, rank = pipe
    kernel.send((INTERRUPT, 5))
    kernel.send((INTERRUPT, 6))
    assert not _interrupted_before_start(rank, 7)
    assert not rank.poll(0)


def test_nothing_on_the_pipe_is_no_interrupt(pipe):
    _kernel, rank = pipe
    assert not _interrupted_before_start(rank, 1)


def test_what_is_not_an_interrupt_is_kept_for_the_loop_in_order(pipe):
    kernel, rank = pipe
    kernel.send((INTERRUPT, 2))
    kernel.send(None)  # the world is stopping: the rank leaves after this job
    kernel.send((INTERRUPT, 3))
    assert _interrupted_before_start(rank, 3)
    kernel.send("next")
    assert _next_message(rank) is None
    assert _next_message(rank) == "next"
