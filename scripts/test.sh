#!/usr/bin/env bash
# Set everything up and run the test suite (the README's test command; CI runs exactly this).
# Installs Debian's dataset-fashion-mnist when running as root (tests needing it skip otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = "0" ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
    || echo "warning: could not install dataset-fashion-mnist; Fashion-MNIST tests will be skipped" >&2
fi
bash scripts/setup.sh
# sklearn/scipy BLAS threads on top of torch threads oversubscribe 2 cores (measured 10-40x slowdowns)
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -q "$@"
