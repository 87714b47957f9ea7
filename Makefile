# Targets, all working from a fresh clone:
#   make lab    set everything up, then open a working copy of the quickstart in JupyterLab: the folder
#               it serves is LAB_DIR (default work/, git-ignored), seeded from notebooks/ by
#               scripts/lab-folder.sh; the tests run only the tracked notebooks/
#   make test   set everything up, lint and type-check, then run the whole test suite (extra pytest args: PYTEST_ARGS=...),
#               on pytest-xdist's workers, then the browser tests three at a time, then the tests that run alone (scripts/pytest.sh);
#               all but the cluster recipes:
#   make cluster-recipes  the guide's SSH, MPI and Slurm recipes on network-namespace nodes (root; after make test)
#   make runtimes  the test suite again on the stacks users are on (.ci/runtime, .ci/runtimes/*.txt): Colab's
#               and Kaggle's runtimes as they ship (installing nbspawn must change none of their versions) and
#               the ends of the torch range (2.4 on Python 3.10, 2.14.1), and TPU ranks on CPU (torch_xla 2.9);
#               each job builds its own venv in .venvs/
#   make lint   the checks only: ruff (lint and format) and mypy, as pinned in the `test` extra; the
#               extension's ESLint, type check and unit tests (npm)
# Setup is scripts/setup.sh (a no-op when nothing changed); NBSPAWN_VENV and NBSPAWN_TORCH_SPEC pass through.

SHELL := /bin/bash
NBSPAWN_VENV ?= $(CURDIR)/.venv
export NBSPAWN_VENV
PYTEST_ARGS ?=
LAB_DIR ?= $(CURDIR)/work

# jupyter server refuses to start as root without this (containers, CI images)
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab test lint cluster-recipes runtimes runtime-colab-gpu runtime-kaggle-gpu runtime-floor runtime-newest runtime-tpu-cpu

lab:
	bash scripts/setup.sh
	bash scripts/lab-folder.sh "$(LAB_DIR)"
	cd "$(LAB_DIR)" && "$(NBSPAWN_VENV)/bin/jupyter" lab $(ALLOW_ROOT) quickstart.ipynb

# ruff's rules and mypy's files are in pyproject.toml; both run from the repository root. The
# extension's node_modules come with setup (pip's build of the extension runs npm install). mypy (34 s
# of one core) runs beside the extension's checks (16 s): its output is held until they are done, so
# the two never interleave, and either failing fails the target.
lint:
	"$(NBSPAWN_VENV)/bin/ruff" check nbspawn tests bench
	"$(NBSPAWN_VENV)/bin/ruff" format --check nbspawn tests bench
	mypy_out="$$(mktemp)"; trap 'rm -f "$$mypy_out"' EXIT; \
	"$(NBSPAWN_VENV)/bin/mypy" >"$$mypy_out" 2>&1 & mypy=$$!; \
	(cd labextension && { [[ -d node_modules ]] || npm ci --no-audit --no-fund; } && npm run --silent lint && npm run --silent typecheck && npm test --silent); npm=$$?; \
	wait $$mypy; rc=$$?; echo '"$(NBSPAWN_VENV)/bin/mypy"'; cat "$$mypy_out"; \
	[[ $$npm -eq 0 && $$rc -eq 0 ]]

# pytest exits 5 when it collected nothing: that is a failure too, said out loud.
# nbspawn is installed editable: its modules are this clone's, which no installer byte-compiled. Where
# PYTHONDONTWRITEBYTECODE is set (these machines, CI) every kernel and every spawned rank compiled them
# again at import (0.3 s of CPU for all its modules, measured with a core busy); compileall writes their
# .pyc once (an edited module's stale .pyc is ignored, as always).
test:
	bash scripts/setup.sh
	"$(NBSPAWN_VENV)/bin/python" -m compileall -q nbspawn
	$(MAKE) --no-print-directory lint
	bash scripts/pytest.sh "$(NBSPAWN_VENV)/bin/python" $(NOT_RECIPES) $(SPAWN_AT_THE_NEWEST_TORCH) $(PYTEST_ARGS); rc=$$?; \
	if [[ $$rc -eq 5 ]]; then echo "make test: no tests were collected" >&2; fi; \
	exit $$rc

# The guide's cluster recipes (SSH, MPI, Slurm), run for real: two network-namespace nodes per module, whose
# daemons (sshd, mpiexec's, slurmctld and slurmd) each fixture starts, and under CI as root first installs
# from Debian. A CI job of their own (`.ci/run`), after `make test`, which leaves them out; they need root.
RECIPE_TESTS := tests/cluster/test_cluster_recipes.py tests/cluster/test_cluster_slurm.py
NOT_RECIPES := $(foreach t,$(RECIPE_TESTS),--ignore=$(t))
cluster-recipes:
	"$(NBSPAWN_VENV)/bin/python" -m pytest $(RECIPE_TESTS) -q -rs -p no:cacheprovider \
		$(if $(NBSPAWN_JUNIT_DIR),--junitxml=$(NBSPAWN_JUNIT_DIR)/recipes.xml)

# Each job: `.ci/runtime NAME PYTEST-ARGS`; which tests each runs is chosen for CI's time budget (the whole
# .ci/run under 40 min on 2 cores). `make -k runtimes` runs them all whatever fails. Each needs `make test`'s
# build of the extension (it installs the clone).
# The hosted runtimes run ranks as their users get them: fork (a CPU runtime's default) and forkserver (a GPU
# runtime's); spawn, asked for by name only, runs on the development stack and at the newest end of the torch range.
HOSTED := --start-methods fork,forkserver
# Nor do they run clusters (ipyparallel engines on other machines): no other machine can reach a hosted VM.
NO_CLUSTERS := --ignore=tests/cluster/test_cluster.py --deselect "tests/kernel/test_notebooks.py::test_notebook_runs[cluster.ipynb]"
KERNEL_TESTS := tests --ignore=tests/cluster/test_cluster_nodes.py --ignore=tests/cluster/test_cluster_worlds.py $(NOT_RECIPES) \
	--ignore=tests/kernel/test_frameworks.py
# Kaggle's kernel packages are Colab's (IPython 7.34, ipykernel 6.17.1, jupyter_client 7.4.9), which the Colab
# job runs every kernel test on; what differs is Python 3.12, torch 2.10 and ipywidgets 8.1.5. Its job runs
# what ipywidgets 8 touches over ipykernel 6's comms: the live view and rank widgets, rank output (rich,
# tqdm's notebook bars), the runs a page lists, each rank's GPU memory drawn, and the hosted-runtime notice.
# Python 3.12 and torch 2.10 lie inside what the other jobs run: fresh cells, kept worlds and torch's spawn
# call run on Python 3.10 with torch 2.4 (the floor), 3.11 with 2.13 and 2.14.1 (make test, the newest) and
# 3.13 with 2.11 (Colab); the pure functions (tests/unit, none imports ipywidgets) on 3.11 and 3.13. Until
# 2026-12-02 this job ran those too: 150 s of its 230.
KAGGLE_TESTS := tests/runtimes/test_hosted_runtime.py tests/kernel/test_view_widget.py \
	tests/kernel/test_rank_widgets.py tests/kernel/test_rank_output.py tests/kernel/test_active_runs.py \
	tests/kernel/test_gpu_memory_view.py
# The two ends of the torch range run what torch decides: starting ranks (start_processes), process groups
# and kept worlds, --share and --out (torch's storages and reductions, and what they leave behind), and
# torch's own spawn call. The floor's Python 3.10 adds pdb's (the debugger); the newest job's Python and
# kernel packages are the development stack's, which make test runs everything on.
# Both ends run fork and forkserver; spawn runs at the newest end only, where spawn itself is the subject:
# torch's spawn call (its default) and spawn_core's notebook functions sent by value to a fresh interpreter.
# nbspawn's own code takes the same path for a spawned rank as for a forkserver one (the spec pickled
# through torch's reductions, unpickled and set up by the rank itself: ranks/_cell.py), so kept worlds and
# --share/--out are tested with fork and forkserver (their spawn variants, 161 s of the newest job's 391 s
# of tests, went on 2026-12-02); what spawn adds is Python's fresh interpreter, which the floor's forkserver
# server also is, importing torch 2.4 and nbspawn on Python 3.10.
TORCH_RANGE_TESTS := tests/kernel/test_spawn_core.py tests/kernel/test_worlds.py tests/kernel/test_handoff.py \
	tests/kernel/test_handoff_leaks.py tests/kernel/test_torch_spawn_call.py
# The spawn start method (asked for by name only; a spawned rank imports torch anew, 2-2.5 s of CPU, so a
# spawn variant costs 3-7 times its fork variant) runs these modules' spawn variants at the newest end of
# the torch range, on make test's Python and kernel packages, and not again in make test on the torch
# below it. make test runs every other module's spawn variants.
SPAWN_TESTS_AT_THE_NEWEST_TORCH := tests/kernel/test_spawn_core.py tests/kernel/test_torch_spawn_call.py
comma := ,
empty :=
space := $(empty) $(empty)
SPAWN_AT_THE_NEWEST_TORCH := --spawn-runs-elsewhere $(subst $(space),$(comma),$(strip $(SPAWN_TESTS_AT_THE_NEWEST_TORCH)))
# nbspawn's wheel is built once for them all (NBSPAWN_WHEEL: 13 s of each job's install was pip building it
# from the clone); a job run by hand builds its own from the clone. The jobs share one uv cache
# (NBSPAWN_UV_CACHE, beside their venvs, so a venv's files are hard links into it), removed when they end:
# Kaggle's and the TPU's torch take the same CUDA 12.8 libraries, Colab's and the newest's most of CUDA
# 13's, and a job installs what an earlier one fetched without fetching or unpacking it again (the TPU's
# venv ready in 52 s instead of 83, after Kaggle's: its cache was 10 GB then). The floor's torch 2.4 shares
# no CUDA library with another job's, so it keeps out of the cache (the disk holds less at once).
RUNTIME_JOBS := runtime-colab-gpu runtime-kaggle-gpu runtime-floor runtime-newest runtime-tpu-cpu
runtimes:
	wheels="$$(mktemp -d)"; cache="$${NBSPAWN_RUNTIME_VENVS:-$(CURDIR)/.venvs}/.uv-cache"; \
	trap 'rm -rf "$$wheels" "$$cache"' EXIT; mkdir -p "$$cache"; \
	"$(NBSPAWN_VENV)/bin/python" -m pip wheel -q --no-deps --no-cache-dir -w "$$wheels" . && \
	NBSPAWN_WHEEL="$$(ls "$$wheels"/nbspawn-*.whl)" NBSPAWN_UV_CACHE="$$cache" $(MAKE) --no-print-directory -k $(RUNTIME_JOBS)
# Colab's job runs what Colab's stack decides: the pure functions on Python 3.13, Kaggle's set (the kernel
# packages are the same), fresh cells, kept worlds and torch's spawn call, and what else touches IPython
# 7.34, ipykernel 6.17's stdin and debug channels, nbclient, torch 2.11's flight recorder and shared memory,
# and Python 3.13: the debugger and prompts, the terminal, the notebooks, the X-ray, the hand-off; and the
# classic Notebook in a browser (Colab's widget stack: ipywidgets 7.7.1, anywidget 0.9.21).
# What runs the same whatever the kernel packages (programs, a rank's children, where, the lifecycle, the
# resources, shm) runs in make test, and at the ends of the torch range where torch decides it.
COLAB_TESTS := tests/unit $(KAGGLE_TESTS) tests/kernel/test_spawn_core.py tests/kernel/test_worlds.py \
	tests/kernel/test_torch_spawn_call.py tests/kernel/test_debugger.py tests/kernel/test_debug_magic.py tests/kernel/test_terminal.py \
	tests/kernel/test_shell_replies.py tests/kernel/test_notebooks.py tests/kernel/test_handoff.py tests/kernel/test_handoff_leaks.py tests/kernel/test_names.py \
	tests/kernel/test_cell_reports.py tests/kernel/test_world_on.py tests/kernel/test_show_shards.py \
	tests/kernel/test_xray_cells.py tests/kernel/test_xray_values.py tests/browser/test_classic_notebook.py
# Of the notebooks, Colab's job leaves out what its own tests prove on this stack already and what runs
# the same whatever the kernel packages: the cluster (no other machine reaches a hosted VM), programs and
# background runs (subprocesses: make test), --share/--out (test_handoff runs here), and torch's spawn call
# (its cells, the DDP tutorial through nbspawn.spawn, a rank's failure as torch's exception at the user's
# line, torch's own call routed with join=False and joined in a loop, are test_torch_spawn_call's tests,
# which run here: 61 s of the job's 340 s, 2026-12-02).
COLAB_NOT_NOTEBOOKS := $(foreach nb,cluster scripts_and_background shared_tensors torch_spawn,--deselect "tests/kernel/test_notebooks.py::test_notebook_runs[$(nb).ipynb]")
runtime-colab-gpu:
	NBSPAWN_BROWSER_WORKERS=1 bash .ci/runtime colab-gpu $(COLAB_TESTS) $(COLAB_NOT_NOTEBOOKS) $(HOSTED) -q
runtime-kaggle-gpu:
	NBSPAWN_BROWSER_WORKERS=0 bash .ci/runtime kaggle-gpu -m "not browser" $(KAGGLE_TESTS) $(HOSTED) -q
runtime-floor:
	NBSPAWN_BROWSER_WORKERS=0 NBSPAWN_INSTALL_WITH=uv NBSPAWN_UV_CACHE= bash .ci/runtime floor -m "not browser" $(TORCH_RANGE_TESTS) tests/kernel/test_debugger.py --start-methods fork,forkserver -q
runtime-newest:
	NBSPAWN_BROWSER_WORKERS=0 NBSPAWN_INSTALL_WITH=uv bash .ci/runtime newest -m "not browser" $(TORCH_RANGE_TESTS) -q
# TPU ranks on CPU (torch 2.9.1 + torch_xla 2.9.0, pinned: the tests touch torch_xla internals): torch_xla's
# topology code with faked chips, and 4 real ranks on XLA CPU devices; about 5 min, most of it the build
TPU_TESTS := tests/unit/test_unit_tpu.py tests/runtimes/test_tpu.py
runtime-tpu-cpu:
	NBSPAWN_BROWSER_WORKERS=0 NBSPAWN_INSTALL_WITH=uv bash .ci/runtime tpu-cpu -m "not browser" $(TPU_TESTS) -q -rs
