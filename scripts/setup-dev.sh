#!/usr/bin/env bash
# Set up a development/test environment on a fresh Linux machine: .venv with a CPU build of
# torch (pinned: an unpinned `torch` would pull a multi-GB CUDA build), gpunb in editable
# mode with its test tools, Debian's Chromium for the real-browser test, and a small
# .venv-ipython8 for the cell-number tests on IPython 8 (scripts/setup-ipython8.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test]"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup-dev: install Debian's chromium (sudo apt-get install chromium) for the browser test" >&2
  fi
fi
python -c "import gpunb, torch; print('gpunb', gpunb.__version__, '| torch', torch.__version__)"
bash scripts/setup-ipython8.sh
