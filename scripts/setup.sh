#!/usr/bin/env bash
# Set up the project's virtual environment: the one step behind `make lab` and `make test`.
#
#   NBSPAWN_VENV        where the venv lives (default: <repo>/.venv)
#   NBSPAWN_TORCH_SPEC  what to install when the venv has no torch (default: torch==2.13.0, a CPU
#                       wheel). Torch goes in first, on its own, because letting pip resolve the bare
#                       `torch>=2.4` of pyproject.toml would pull a multi-GB CUDA build.
#   NBSPAWN_EXTRAS      the project's extras to install (default: test,lab,frameworks,marimo; CI runs
#                       them all). test,lab leaves out lightning, transformers and accelerate (~280 MB)
#                       and marimo: tests/kernel/test_frameworks.py and the marimo tests then skip,
#                       saying so.
#   PYTHON              interpreter that creates the venv (default: python3)
#
# Idempotent: a stamp file newer than pyproject.toml means nothing changed, and pip is not run.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NBSPAWN_VENV:-$root/.venv}"
torch_spec="${NBSPAWN_TORCH_SPEC:-torch==2.13.0}"
extras="${NBSPAWN_EXTRAS:-test,lab,frameworks,marimo}"
stamp="$venv/.nbspawn-setup-stamp"
py="$venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

say() { echo "setup: $*" >&2; }

if [[ ! -x "$py" ]]; then
    say "creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi

# Fast path: the stamp is current, for these extras, and both packages are still there (find_spec
# imports nothing).
if [[ -f "$stamp" && "$stamp" -nt "$root/pyproject.toml" && "$(cat "$stamp")" == "$extras" ]] &&
    "$py" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('torch') and u.find_spec('nbspawn')))"; then
    exit 0
fi

# torch is looked up, never imported: imported before the extras bring numpy, it warns "Failed to
# initialize NumPy" into a newcomer's first setup (issue #57, item 10)
if ! "$py" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('torch'))"; then
    say "installing $torch_spec"
    "$py" -m pip install "$torch_spec"
fi

# Pin whatever torch is now installed, so resolving the extras can never swap it for another build.
torch_version="$("$py" -c "import importlib.metadata as m; print(m.version('torch'))")"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"

# The extras (about 170 packages: JupyterLab, Lightning, transformers, marimo, playwright, ...) go in with
# uv, the same versions as pip's in about 20 s instead of 75 (measured on a fresh clone); byte-compiled
# as pip does (where PYTHONDONTWRITEBYTECODE is set a module without its .pyc is compiled at every import).
# Torch stays pip's: it is installed and pinned by now, and pip's configuration (a local wheel, an index)
# is what chose it. --system-certs: the system's CA store, where a TLS-intercepting proxy's CA is installed.
# If uv cannot be had or fails, pip does it.
say "installing nbspawn (editable) with [$extras] next to torch $torch_version"
uv="$venv/bin/uv"
[[ -x "$uv" ]] || "$py" -m pip install -q uv || true
if ! { [[ -x "$uv" ]] && "$uv" pip install -q --compile-bytecode --system-certs --python "$py" \
    --constraint "$constraints" --editable "$root[$extras]"; }; then
    say "uv could not install them; pip instead"
    "$py" -m pip install --constraint "$constraints" --editable "$root[$extras]"
fi

# jsonschema imports rfc3987_syntax wherever it is installed (jupyter-events asks for jsonschema[format-nongpl]),
# and that import builds some 35 Lark parsers: 1.8 s of CPU in every process that imports jsonschema: each
# Jupyter server, nbclient and nbconvert, a test process that imports nbformat (python-jsonschema/jsonschema#1428).
# Without it jsonschema checks no "iri" format, which no Jupyter schema uses. Not on the runtime jobs' venvs,
# which hold what their runtime holds.
"$py" -m pip uninstall -q -y rfc3987-syntax 2>/dev/null || true

echo "$extras" >"$stamp"
say "ready: $venv"
