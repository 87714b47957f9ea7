"""Which skips a CI job may have: a green CI means every layer the project builds or installs ran.

A test skips where a part it needs is missing.  Some parts are the machine's (a GPU, a memory control
group, root for network namespaces, a second address): those skips stay, and CI's summary counts them
with their reasons.  Others are the project's own: the widget bundle its build makes, the extras and
test tools its setup installs.  Under CI (``CI`` set), a skip for one of those fails the test instead,
unless the job's stack is one where that part is rightly absent (a hosted runtime has no JupyterLab,
ipykernel 6 has no subshells).  ``NBSPAWN_CI_JOB`` names the job (``.ci/runtime`` sets it; ``dev``,
the README's ``make test``, otherwise).
"""

from __future__ import annotations

import os
import re

# the hosted runtimes' and the torch range's jobs: the runtime's own packages and the test tools only
RUNTIME_JOBS = ("colab-gpu", "kaggle-gpu", "floor", "newest", "tpu-cpu")

# (what the project provides, a skip reason that says it is missing, the jobs where it rightly is)
PROVIDED: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    ("the widget bundle", re.compile(r"widget\.js is not built|widget's front end is not built"), ()),
    ("a test tool", re.compile(r"^not installed: \[.*'(ipywidgets|rich)'"), ()),
    ("a test tool", re.compile(r"\b(playwright|tqdm|matplotlib|mpi4py)\b.* is not installed|needs mpi4py"), ()),
    (
        "the lab extra",
        re.compile(r"jupyterlab is not installed|notebook 7 is not installed|dark theme is not installed"),
        RUNTIME_JOBS,
    ),
    ("the marimo extra", re.compile(r"marimo is not installed"), RUNTIME_JOBS),
    ("the frameworks extra", re.compile(r"^not installed(: | here: )"), RUNTIME_JOBS),
    ("ipykernel's subshells", re.compile(r"has no subshells"), ("colab-gpu", "kaggle-gpu")),
    (
        "the classic Notebook",
        re.compile(r"needs the classic Notebook 6"),
        tuple(j for j in ("dev", *RUNTIME_JOBS) if j != "colab-gpu"),
    ),
    ("torch_xla", re.compile(r"torch_xla is not installed"), tuple(j for j in ("dev", *RUNTIME_JOBS) if j != "tpu-cpu")),
)


def job() -> str | None:
    """The CI job this is (``dev`` for ``make test``), or None outside CI."""
    if os.environ.get("CI", "").lower() not in ("true", "1", "yes"):
        return None
    return os.environ.get("NBSPAWN_CI_JOB") or "dev"


def refused(reason: str, job: str | None) -> str | None:
    """Why a skip with this reason fails the job (None: it may skip), as one line."""
    if job is None:
        return None
    for what, said, rightly_absent in PROVIDED:
        if said.search(reason) and job not in rightly_absent:
            return f"CI job {job!r} skipped a layer the project provides ({what}): {reason}"
    return None


def skip_reason(longrepr: object) -> str:
    """A skipped report's reason: pytest keeps it as ``(path, line, "Skipped: reason")``."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)
