"""The hpc_job label: which Slurm job owns which GPU, from the prolog's mapping files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from stepscope.attribution.hpc_jobs import read_hpc_jobs


def test_mapping_files_are_read_as_the_prolog_writes_them(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "1").write_text("4243_7\n4244\n")  # array task, and a second job sharing it
    (tmp_path / ".2.4245").write_text("4245\n")  # the prolog's half-written temp file
    (tmp_path / "3").write_text('bad "id"\n')  # not label-safe: skipped
    (tmp_path / "notes").write_text("x\n")
    read = read_hpc_jobs(tmp_path)
    assert read.jobs == {0: "4242", 1: "4243_7,4244"}
    assert sorted(read.skipped) == ["'3': no valid job id", "'notes': not a GPU index"]
    assert read_hpc_jobs(tmp_path / "missing").jobs == {}


def test_hostile_entries_are_skipped_and_counted_never_followed_or_blocked_on(
    tmp_path: Path,
) -> None:
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "٣").write_text("666\n")  # an Arabic-Indic digit: int() would accept it
    (tmp_path / "²").write_text("666\n")  # str.isdigit() accepts superscripts
    (tmp_path / "2").symlink_to("/etc/hostname")  # must not export the host name
    os.mkfifo(tmp_path / "3")  # a blocking open would hang the sampler forever
    (tmp_path / "4").mkdir()
    (tmp_path / "5").write_text("1" * 100_000)  # read is capped; one long line is no id
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(read_hpc_jobs(tmp_path)))
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading the directory blocked"
    read = result[0]
    assert read.jobs == {0: "4242"}  # type: ignore[attr-defined]
    skipped = sorted(s.split(":")[0] for s in read.skipped)  # type: ignore[attr-defined]
    assert skipped == ["'2'", "'3'", "'4'", "'5'", "'²'", "'٣'"]
