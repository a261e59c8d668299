#!/usr/bin/env bash
# Quick start on a fresh machine. Idempotent: creates .venv and installs the project once.
#   ./quickstart.sh run    set up, then run the main job on the shipped defaults (the shipped
#                          reference base, experiments/configs/reference_main.yaml)
#   ./quickstart.sh test   set up, then run the test suite
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev]'
    rm -f .venv/.installed-*; touch "$stamp"
fi
case "${1:-run}" in
    run)  shift || true; exec .venv/bin/clp run experiments/configs/reference_main.yaml "$@" ;;
    # One OpenMP thread per test process: the suite runs multi-process tests (DDP, resume) and a
    # second thread per process only adds barrier stalls on a 2-core machine.
    test) shift || true; OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} exec .venv/bin/python -m pytest -q "$@" ;;
    *) echo "usage: $0 run|test [extra args]" >&2; exit 2 ;;
esac
