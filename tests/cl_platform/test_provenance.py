"""The code fingerprint (one hash per file, one over all), the machine record and the phase clock."""
import hashlib
import shutil

import torch

from cl_platform.provenance import (
    BASE_CODE, PROJECT_ROOT, VERSIONS, PhaseClock, all_code, base_code, changed_modules, code_fingerprint, machine,
    session, source_files,
)
from cl_platform.results import package_versions


def copy_tree(dst, files):
    for name in files:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROJECT_ROOT / name, dst / name)
    return dst


def test_editing_one_byte_of_a_model_file_changes_that_file_and_the_combined_hash_only(tmp_path):
    root = copy_tree(tmp_path / "copy", BASE_CODE)
    before = code_fingerprint(root, BASE_CODE)
    assert before == base_code()  # a copy of the same files is the same code, wherever it lies
    assert sorted(before["modules"]) == sorted(BASE_CODE)
    source = (root / "cl_platform/memory/fwpkm.py").read_bytes()
    assert before["modules"]["cl_platform/memory/fwpkm.py"] == hashlib.sha256(source).hexdigest()

    edited = bytearray(source)
    edited[len(edited) // 2] ^= 1
    (root / "cl_platform/memory/fwpkm.py").write_bytes(bytes(edited))
    after = code_fingerprint(root, BASE_CODE)
    assert after["combined"] != before["combined"]
    assert changed_modules(before, after) == ["cl_platform/memory/fwpkm.py"]
    assert {k: v for k, v in after["modules"].items() if k != "cl_platform/memory/fwpkm.py"} == \
        {k: v for k, v in before["modules"].items() if k != "cl_platform/memory/fwpkm.py"}


def test_a_missing_file_is_a_change_and_no_record_is_unknown(tmp_path):
    root = copy_tree(tmp_path / "copy", BASE_CODE)
    (root / "cl_platform/memory/norm.py").unlink()
    missing = code_fingerprint(root, BASE_CODE)
    assert missing["modules"]["cl_platform/memory/norm.py"] == "absent"
    assert changed_modules(base_code(), missing) == ["cl_platform/memory/norm.py"]
    assert changed_modules(base_code(), base_code()) == []
    assert changed_modules(None, base_code()) is None
    assert changed_modules({"combined": "x"}, base_code()) is None  # a record without per-file hashes


def test_the_base_code_list_names_existing_files_once():
    assert len(set(BASE_CODE)) == len(BASE_CODE)
    assert all((PROJECT_ROOT / name).is_file() for name in BASE_CODE)
    assert "streams/tokenizer.py" not in BASE_CODE  # the tokenizer fingerprint in the key covers it


def test_a_run_records_every_source_file_of_the_platform():
    files = source_files(PROJECT_ROOT)
    assert set(BASE_CODE) <= set(files)
    assert {"cl_platform/engine.py", "strategies/__init__.py", "experiments/run.py", "analysis/metrics.py"} <= set(files)
    assert all_code() == code_fingerprint(PROJECT_ROOT, files)
    record = session()
    assert record["code"] == all_code()
    assert record["versions"] == package_versions(VERSIONS)
    assert {"cl-platform", "torch", "lightning", "numpy"} <= set(record["versions"])


def test_machine_names_cpu_threads_and_os():
    m = machine()
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert m["torch_threads"] == torch.get_num_threads()
    assert m["cores"] >= 1 and m["os"] and m["python"]


class FakeClock:
    """A clock the test advances by hand, so sums can be checked exactly."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_phase_clock_accumulates_across_a_restart():
    t = FakeClock()
    clock = PhaseClock(t)
    clock.start("row0_eval")
    t.now += 2.0
    clock.start("exp1_train")  # ends row0_eval
    t.now += 3.0
    saved = clock.state_dict()  # a checkpoint mid-phase carries the time so far
    assert saved == {"row0_eval": 2.0, "exp1_train": 3.0}
    t.now += 7.0  # lost: the process is killed after the checkpoint

    resumed = PhaseClock(t)
    resumed.load_state_dict(saved)
    resumed.start("exp1_train")
    t.now += 4.0
    resumed.start("exp1_eval")
    t.now += 1.0
    resumed.stop()
    t.now += 50.0  # nothing runs: nothing is counted
    assert resumed.state_dict() == {"row0_eval": 2.0, "exp1_train": 7.0, "exp1_eval": 1.0}
