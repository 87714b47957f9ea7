"""One status watch per kernel, found again after an autoreload of its module: the watch left on the
kernel is an instance of the earlier import's class, recognised by what it offers (``_busy._KeepsBusy``),
not wrapped a second time.  In a process of its own: the reload must not change the class other tests see."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import importlib
from nbspawn.views import _busy

class Kernel:  # what the watch wraps and asks of ipykernel's kernel
    def _publish_status(self, status, channel, parent=None):
        pass

    def get_parent(self, channel):
        return {}

kernel = Kernel()
watch = _busy._watch(kernel)
assert isinstance(watch, _busy._StatusWatch) and _busy._watch(kernel) is watch
importlib.reload(_busy)  # autoreload: a new _StatusWatch class
again = _busy._watch(kernel)
assert again is watch and not isinstance(again, _busy._StatusWatch), again
assert not isinstance(kernel._publish_status.publish, _busy._KeepsBusy)  # ipykernel's own is not a watch
print("found")
"""


def test_an_earlier_imports_watch_is_found_not_wrapped_again():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.strip() == "found", done.stderr
