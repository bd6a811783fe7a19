"""HPC job labels on a running exporter's GPU series."""

from __future__ import annotations

from pathlib import Path

from tests.support import parse_samples, start_exporter, wait_for


def test_gpu_series_carry_the_owning_job_while_the_mapping_says_so(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    exp = start_exporter(["--simulate", "2", "--interval", "0.2", "--hpc-job-dir", str(jobs)])
    try:
        def owners() -> dict[str, str | None]:
            samples = parse_samples(exp.metrics())["DCGM_FI_DEV_GPU_UTIL"]
            return {lbl["gpu"]: lbl.get("hpc_job") for lbl, _ in samples}

        assert owners() == {"0": None, "1": None}  # no directory yet: no job anywhere
        jobs.mkdir()
        (jobs / "1").write_text("4242\n")
        (jobs / "٣").write_text("4242\n")
        wait_for(lambda: owners() == {"0": None, "1": "4242"})
        fams = parse_samples(exp.metrics())
        errors = {lbl["collector"]: v for lbl, v in fams["stepscope_collector_errors_total"]}
        assert errors["hpc_jobs"] >= 1  # the bad entry is counted, the rest still read
        (jobs / "1").unlink()  # the epilog ran
        wait_for(lambda: owners() == {"0": None, "1": None})
    finally:
        assert exp.stop() == 0


def test_without_the_setting_there_is_no_hpc_job_label() -> None:
    exp = start_exporter(["--simulate", "1"])
    try:
        fams = parse_samples(exp.metrics())
        assert all("hpc_job" not in lbl for lbl, _ in fams["DCGM_FI_DEV_GPU_UTIL"])
        collectors = {lbl["collector"] for lbl, _ in fams["stepscope_collector_success"]}
        assert "hpc_jobs" not in collectors
    finally:
        exp.stop()
