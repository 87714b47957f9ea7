"""``executors._procs.inherited_heap_frozen``: what a forked rank's collector sees of the kernel's heap."""

import gc
import os

from nbspawn.executors._procs import inherited_heap_frozen


def _forked_child_freeze_count() -> int:
    """The freeze count a child forked now sees first thing (what it inherited is frozen or not)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one number, then out
        os.write(write_end, str(gc.get_freeze_count()).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        count = int(pipe.read())
    os.waitpid(pid, 0)
    return count


def test_a_rank_forked_meanwhile_freezes_all_it_inherited_and_the_kernel_is_left_as_it_was():
    before = gc.get_freeze_count()  # 0, or what Python froze at start-up (375 objects on 3.12)
    kept = [object() for _ in range(10)]
    with inherited_heap_frozen(forking=True):
        in_child = _forked_child_freeze_count()
        assert gc.get_freeze_count() <= before  # nothing frozen in the kernel: its collector is untouched
    assert in_child > before + len(gc.get_objects()) // 2  # every object it inherited
    assert kept


def test_a_fork_outside_it_is_left_alone():
    with inherited_heap_frozen(forking=True):
        pass
    assert _forked_child_freeze_count() == gc.get_freeze_count()  # the hook stays, and does nothing


def test_nothing_is_frozen_for_ranks_that_are_not_forked():
    with inherited_heap_frozen(forking=False):
        assert _forked_child_freeze_count() == gc.get_freeze_count()


def test_a_heap_the_user_froze_stays_frozen_as_they_left_it():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with inherited_heap_frozen(forking=True):
            assert _forked_child_freeze_count() >= frozen - 100
        # never unfrozen behind the user's back (an unfreeze leaves 0): the count only drops by the
        # few frozen objects freed meanwhile, as any frozen object is when its last reference goes
        assert gc.get_freeze_count() > frozen - 100
    finally:
        gc.unfreeze()
