#!/usr/bin/env bash
# The folder `make lab` serves: a working copy of the example notebooks, outside what the tests run.
# notebooks/ holds the tracked examples, which tests/kernel/test_notebooks.py executes; a newcomer's scratch
# notebook there, or JupyterLab's autosave of a tracked one, would change what `make test` runs. So
# JupyterLab opens DIR (default: work/, git-ignored), seeded with a copy of each example that is not
# there yet: what the user saved in DIR is never overwritten.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$here/work}"
mkdir -p "$dir"
for nb in "$here"/notebooks/*.ipynb; do
    [[ -e "$dir/$(basename "$nb")" ]] || cp "$nb" "$dir/"
done
echo "$dir"
