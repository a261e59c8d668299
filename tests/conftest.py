"""A tiny real setup shared by the runner tests (cl_platform, experiments): 2 domains of the
shipped corpora, 32-token segments, a 2-layer model with one small FwPKM layer; stream cache and
pretrained base built once per session.

Tests write run YAMLs with `tiny.config(path, **overrides)`; nested overrides merge into the
defaults below (`cl={"mode": "finetune"}` changes only cl.mode).
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

STREAM = {
    "domains": [
        {"name": "math", "source": "corpus:math", "filters": {"max_documents": 400}},
        {"name": "code", "source": "corpus:code", "filters": {"max_documents": 20}},
    ],
    "seq_len": 32,
    "seed": 0,
    "token_budget": {"pretrain": 16384, "adapt": 384, "eval": 256},  # 512 / 12 / 8 segments
}

RUN = {
    "model": {
        "preset": "small", "n_layer": 2, "d_model": 64, "n_head": 2, "fwpkm_layers": [1], "window": 16,
        "fwpkm": {"num_subkeys": 16, "d_key": 32, "d_value": 32},
    },
    "pretrain": {"steps": 150, "batch_size": 16, "lr": 3.0e-3, "warmup_steps": 10, "eval_every": 50,
                 "checkpoint_every": 50, "log_every": 5, "eval_segments": 4, "fwpkm": {"chunk": 16}},
    "cl": {"batch_size": 2, "eval_batch_size": 4, "curve_every": 2, "curve_segments": 2, "checkpoint_every": 3},
}


def merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("kwargs",):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def write_yaml(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run_cli(args: list[str], env_extra: dict | None = None, check: bool = True, script: str | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """`clp ARGS` in a fresh interpreter with the suite's thread count (OMP_NUM_THREADS, 1 if unset:
    results are bit-reproducible across processes only at a fixed thread count, and CI runs the
    suite at 1 and at 2). `script`: Python run instead of the plain CLI, which ends by calling
    `experiments.cli.main(sys.argv[1:])`."""
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": str(ROOT),
           **(env_extra or {})}
    code = script or "import sys\nfrom experiments.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"clp {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    stream = write_yaml(root / "stream.yaml", {**STREAM, "cache_dir": str(root / "cache")})
    runs = root / "runs"

    def config(path: Path, **overrides) -> Path:
        data = merge({**RUN, "stream": str(stream), "runs_root": str(runs)}, overrides)
        return write_yaml(Path(path), data)

    return SimpleNamespace(root=root, stream=stream, runs=runs, config=config, run_cli=run_cli,
                           stream_spec=STREAM, write_yaml=write_yaml)


@pytest.fixture(scope="session")
def tiny_base(tiny):
    """The pretrained tiny base (pretrained once per session into the shared runs root)."""
    from experiments.base import resolve_base
    from experiments.setup import load_setup

    setup = load_setup(tiny.config(tiny.root / "base.yaml"))
    base = resolve_base(setup, progress_bar=False, say=lambda _: None)
    path, record = base.path, base.record
    return SimpleNamespace(path=path, record=record, setup=setup)
