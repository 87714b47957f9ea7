"""``executors._procs.kernel_heap_frozen``: what the kernel's collector sees around a fork of ranks."""

import gc

from nbspawn.executors._procs import kernel_heap_frozen


def test_the_heap_is_frozen_while_ranks_are_forked_and_given_back_after():
    assert gc.get_freeze_count() == 0
    with kernel_heap_frozen(forking=True):
        assert gc.get_freeze_count() > 0  # a rank forked now inherits every object frozen
    assert gc.get_freeze_count() == 0  # the kernel collects its own garbage again


def test_the_heap_is_given_back_even_when_starting_the_ranks_fails():
    try:
        with kernel_heap_frozen(forking=True):
            raise OSError("fork failed")
    except OSError:
        pass
    assert gc.get_freeze_count() == 0


def test_nothing_is_frozen_for_ranks_that_are_not_forked():
    with kernel_heap_frozen(forking=False):
        assert gc.get_freeze_count() == 0


def test_a_heap_the_user_froze_stays_frozen_as_they_left_it():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with kernel_heap_frozen(forking=True):
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen  # never unfrozen behind the user's back
    finally:
        gc.unfreeze()
