"""The lines that close CI's log: what each job and phase ran, why tests were skipped, and each
failure with its phase and its assertion's first line, so a red CI says why in one look.

    python scripts/ci_summary.py DIR

DIR holds what ``.ci/run`` gathered (``NBSPAWN_JUNIT_DIR``): a JUnit report per job and phase
(``JOB-PHASE.xml``, ``scripts/pytest.sh``) and a ``JOB.job`` per job (``EXIT-STATUS SECONDS``).  The
last line is the plain count, ``ci: N passed, N failed, N skipped``.  Standard library only: it runs
whether or not setup got as far as making the venv.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MOST_FAILURES = 40  # failures listed; the count says how many more


@dataclass
class Phase:
    """One pytest run's outcome: a job's phase."""

    name: str  # "dev-parallel", "colab-gpu-browser", "recipes"
    passed: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (test id, its first line)
    skipped: list[str] = field(default_factory=list)  # reasons
    seconds: float = 0.0


def first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:240]
    return "(no message)"


def test_id(case: ET.Element) -> str:
    """``tests/x/test_y.py::test_z``, from JUnit's dotted class name."""
    module = (case.get("classname") or "").replace(".", "/")
    return f"{module}.py::{case.get('name')}" if module else str(case.get("name"))


def read_phase(path: Path) -> Phase:
    phase = Phase(path.stem)
    try:
        root = ET.parse(path).getroot()  # noqa: S314 (our own pytest's reports)
    except (ET.ParseError, OSError) as err:
        phase.failed.append((path.name, f"its report could not be read: {err}"))
        return phase
    for suite in root.iter("testsuite"):
        phase.seconds += float(suite.get("time") or 0)
    for case in root.iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped")
        if bad is not None:
            phase.failed.append((test_id(case), first_line(bad.get("message") or bad.text)))
        elif skipped is not None:
            phase.skipped.append(first_line(skipped.get("message")))
        else:
            phase.passed += 1
    return phase


def read_jobs(folder: Path) -> dict[str, tuple[int, int]]:
    """Each job's exit status and seconds."""
    jobs = {}
    for path in sorted(folder.glob("*.job")):
        parts = path.read_text().split()
        if len(parts) == 2 and all(p.lstrip("-").isdigit() for p in parts):
            jobs[path.stem] = (int(parts[0]), int(parts[1]))
    return jobs


def summary(folder: Path) -> tuple[list[str], bool]:
    """The lines, and whether everything passed."""
    phases = [read_phase(path) for path in sorted(folder.glob("*.xml"), key=lambda p: p.stat().st_mtime)]
    jobs = read_jobs(folder)
    lines = ["", f"ci: summary ({folder})", f"  {'job-phase':<24} {'passed':>7} {'failed':>7} {'skipped':>8} {'seconds':>8}"]
    for phase in phases:
        lines.append(f"  {phase.name:<24} {phase.passed:>7} {len(phase.failed):>7} {len(phase.skipped):>8} {phase.seconds:>8.0f}")
    if jobs:
        lines.append(
            "ci: jobs: "
            + "; ".join(f"{name} {'passed' if rc == 0 else f'FAILED (exit {rc})'} in {s} s" for name, (rc, s) in jobs.items())
        )
    reasons = Counter(reason for phase in phases for reason in phase.skipped)
    if reasons:
        lines.append("ci: skipped, by reason:")
        lines.extend(f"  {count:>5}  {reason}" for reason, count in reasons.most_common())
    failures = [(phase.name, test, said) for phase in phases for test, said in phase.failed]
    silent = 0  # jobs that failed outside their tests (an install, a build): each counts as a failure
    for name, (rc, _seconds) in jobs.items():
        own = [p for p in phases if p.name == name or p.name.startswith(f"{name}-")]
        if rc != 0 and not any(p.failed for p in own):
            why = "no test failed in its reports" if own else "no test report"
            lines.append(f"ci: FAILED: job {name} exited {rc} ({why}: it failed outside its tests; its own lines above say how)")
            silent += 1
    for name, test, said in failures[:MOST_FAILURES]:
        lines.append(f"ci: FAILED [{name}] {test}: {said}")
    if len(failures) > MOST_FAILURES:
        lines.append(f"ci: ... and {len(failures) - MOST_FAILURES} more failures")
    passed = sum(phase.passed for phase in phases)
    lines.append(f"ci: {passed} passed, {len(failures) + silent} failed, {sum(reasons.values())} skipped")
    return lines, not failures and not silent


def main() -> int:
    folder = Path(sys.argv[1])
    if not folder.is_dir():
        print(f"ci: no test reports in {folder}: nothing ran", file=sys.stderr)
        return 1
    lines, ok = summary(folder)
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
