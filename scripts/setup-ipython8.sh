#!/usr/bin/env bash
# A second, small environment with IPython 8 for the cell-number tests: IPython 8 counts a
# cell after it ran, IPython 9 before it runs, and gpunb must show IPython's own In [n] on
# both (tests/test_cell_numbers.py; .ci/run runs it here too). Only what those tests need:
# IPython 8, gpunb and its own dependencies, pytest and nbclient; no torch, no browser.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-ipython8
.venv-ipython8/bin/python -m pip install -q "ipython>=8.17,<9" "pytest>=8" "nbclient>=0.10" "nbformat>=5.9" -e .
.venv-ipython8/bin/python -c "import IPython; print('.venv-ipython8: IPython', IPython.__version__)"
