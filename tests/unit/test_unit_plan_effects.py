"""Planners decide, ``nbspawn._effects`` acts: a plan holds no port and has moved nothing into shared
memory; carrying it out reserves the port and shares the ``--share`` tensors, in that order, and a
failure after the port was reserved lets the port go.  Judged by the real things: the sockets
``_listen`` holds, a tensor's storage, the descriptors this process may open."""

from __future__ import annotations

import os
import resource
from dataclasses import replace

import pytest
import torch

from nbspawn import _listen
from nbspawn._effects import carry_out
from nbspawn._program import read_program_line
from nbspawn._request import RunRequest, Settings
from nbspawn._source import CellSource
from nbspawn.executors._fresh import FreshRanks
from nbspawn.handoff import _shm
from nbspawn.planning._fresh import plan_fresh_cell, plan_program
from nbspawn.planning._plans import FreshPlan


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def shared(tensor: torch.Tensor) -> bool:
    return _shm.is_shared(tensor.untyped_storage())


def share_request(tmp_path, method: str = "fork") -> tuple[RunRequest, torch.Tensor]:
    weights = torch.ones(1000)
    settings = Settings(nprocs=2, start_method=method, backend="gloo", log_dir=str(tmp_path))
    return RunRequest.of(CellSource("y = w.sum()"), settings=settings, namespace={"w": weights}, share=("w",)), weights


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_plan_holds_no_port_and_shares_nothing_until_it_is_carried_out(tmp_path, method):
    request, weights = share_request(tmp_path, method)
    held = set(_listen._held)
    plan = plan_fresh_cell(request, request.work)
    assert isinstance(plan, FreshPlan)
    assert set(_listen._held) == held and plan.spec.master_port == 0  # no socket reserved
    assert not shared(weights) and plan.share == (weights,)  # named, not moved
    spec, executor = carry_out(plan)
    try:
        assert isinstance(executor, FreshRanks) and executor.spec is spec
        # the one new socket held is the spec's port (an old one may have been let go: _listen holds 8 at most)
        assert set(_listen._held) - held == {spec.master_port} and spec.master_port > 0
        assert shared(weights)
        assert (
            replace(spec, placement=replace(spec.placement, master_port=0)) == plan.spec
        )  # the port is all carrying it out changed
    finally:
        _listen.release(spec.master_port)


def test_a_program_plan_holds_no_port(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    line = read_program_line(["train.py"])
    held = set(_listen._held)
    plan = plan_program(RunRequest.of(line, settings=Settings(nprocs=2, log_dir=str(tmp_path))), line)
    assert set(_listen._held) == held and plan.spec.master_port == 0


def test_a_share_that_fails_lets_the_reserved_port_go(tmp_path):
    """The port is reserved first, the tensors shared last: when sharing fails (no descriptor left
    for the memfd), the port is let go and the error is the sharing's own."""
    request, weights = share_request(tmp_path)
    plan = plan_fresh_cell(request, request.work)
    carry_out(FreshPlan(plan.spec))  # every module carrying out needs, imported before descriptors run short
    _listen.release(max(_listen._held))
    held = set(_listen._held)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # the lowest free descriptors, asked of each one (listing /proc/self/fd would count its own open
    # descriptor: one free number missed, and torch 2.10, whose sharing needs one descriptor where 2.13's
    # needs two, then had room for both the socket and the memfd)
    free = [fd for fd in range(soft) if not _is_open(fd)][:3]
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (free[1], hard))  # one for the port's socket, none for the memfd
        # the memfd refused, or torch's duplicate of it (whichever descriptor runs short first)
        with pytest.raises((OSError, RuntimeError), match=r"Too many open files|could not duplicate"):
            carry_out(plan)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert set(_listen._held) == held
    assert not shared(weights)
