"""The hpc_job label: which Slurm job owns which GPU, from the prolog's mapping files."""

from __future__ import annotations

from pathlib import Path

from conftest import parse_samples, start_exporter, wait_for
from stepscope.gpu.hpc_jobs import read_hpc_jobs


def test_mapping_files_are_read_as_the_prolog_writes_them(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "1").write_text("4243_7\n4244\n")  # array task, and a second job sharing it
    (tmp_path / ".2.4245").write_text("4245\n")  # the prolog's half-written temp file
    (tmp_path / "3").write_text('bad "id"\n')  # not label-safe: skipped
    (tmp_path / "notes").write_text("x\n")
    assert read_hpc_jobs(tmp_path) == {0: "4242", 1: "4243_7,4244"}
    assert read_hpc_jobs(tmp_path / "missing") == {}


def test_gpu_series_carry_the_owning_job_while_the_mapping_says_so(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    exp = start_exporter(["--simulate", "2", "--interval", "0.2", "--hpc-job-dir", str(jobs)])
    try:
        def owners() -> dict[str, str]:
            samples = parse_samples(exp.metrics())["DCGM_FI_DEV_GPU_UTIL"]
            return {lbl["gpu"]: lbl["hpc_job"] for lbl, _ in samples}

        assert owners() == {"0": "", "1": ""}  # no directory yet: no job anywhere
        jobs.mkdir()
        (jobs / "1").write_text("4242\n")
        wait_for(lambda: owners() == {"0": "", "1": "4242"})
        (jobs / "1").unlink()  # the epilog ran
        wait_for(lambda: owners() == {"0": "", "1": ""})
    finally:
        assert exp.stop() == 0


def test_without_the_setting_there_is_no_hpc_job_label() -> None:
    exp = start_exporter(["--simulate", "1"])
    try:
        samples = parse_samples(exp.metrics())["DCGM_FI_DEV_GPU_UTIL"]
        assert all("hpc_job" not in lbl for lbl, _ in samples)
    finally:
        exp.stop()
