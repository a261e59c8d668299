#!/usr/bin/env bash
# The device check on a lent GPU (issue 23), in two halves:
#
#   experiments/studies/device_check.sh prepare   # here, with network: the wheels the GPU image lacks -> .whl/
#   experiments/studies/device_check.sh run [speed|device]   # there (device tool: carry [".whl"], timeout 600):
#                                                 #   install them, print the versions, then
#                                                 #   speed (default): `clp bench speed` (issue 52), ≤ 5 min,
#                                                 #     JSON + table into $OUT as each stage ends
#                                                 #   device: `clp bench device` (issue 23), the acceptance table
#
# The lent machine reaches nothing outside it and has its own Python 3.12 with torch, lightning,
# tensorboard, numpy, scipy, pandas, pyarrow, matplotlib and pyyaml; what it lacks (the project's
# own dependencies, and what avalanche-lib imports when it is imported) travels as wheels. The
# whole tree travels too and must stay under 64 MiB: move experiments/bases/ (the shipped bases,
# 135 MB, which the check does not read) out of the checkout for the call.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=(
  # the project's dependencies that the GPU image lacks
  avalanche-lib==0.6.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 omegaconf==2.4.0
  optuna alembic sqlalchemy colorlog mako
  # imported by avalanche-lib at import time (found by blocking imports one by one, 2026-12-04)
  gdown==6.5.1 beautifulsoup4==4.15.0 soupsieve==4.1.4 pytorchcv==0.0.74 qpsolvers==4.13.0
  wandb==0.31.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  platformdirs==4.14.9 sniffio==1.3.1 googleapis-common-protos==1.76.0
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-http-transport==0.66b2
  opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2
  # the public PyTorch port of FwPKM, the layer row's comparison
  fast-weight-product-key-memory==0.2.2 einx torch-einops-utils frozendict
)
case "${1:-}" in
  prepare)
    grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
    mkdir -p .whl
    for w in "${WHEELS[@]}"; do
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl "$w"
    done
    python3 -m pip wheel -q --no-deps -w .whl GPUtil==1.4.0   # avalanche-lib imports it; sdist only
    du -sh .whl ;;
  run)
    t0=$(date +%s)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "setup $(( $(date +%s) - t0 )) s"
    case "${2:-speed}" in
      # 300 s: the check's own caps end it by ~290 s; the rest of the 600 s call is room for a rerun.
      speed) OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 timeout 300 python3 -m experiments.cli bench speed --out "${OUT:-.}" 2>&1 \
               | tee "${OUT:-.}/gpu_speed_check.log" ;;
      device) OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 timeout 520 python3 -m experiments.cli bench device 2>&1 \
               | tee "${OUT:-.}/bench_device.txt" ;;
      *) echo "usage: $0 run [speed|device]" >&2; exit 2 ;;
    esac
    echo "total $(( $(date +%s) - t0 )) s" ;;
  *) echo "usage: $0 prepare|run [speed|device]" >&2; exit 2 ;;
esac
