#!/usr/bin/env bash
# The README's test command: install the project with its test stack, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e '.[dev]'
pytest
