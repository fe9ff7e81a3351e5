"""toolchain/build_horovod.sh bounds its parallel compile jobs by the machine's cores and memory when
HOROVOD_BUILD_JOBS is unset (issue 19, item 7: 8 C++20 jobs on the 4-vCPU/16-GiB image build cluster)."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "toolchain/build_horovod.sh"
GIB = 1024**3


def jobs(tmp_path, cores, available_gib, cgroup_v2=None, cgroup_v1=None, **extra) -> int:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        f"MemTotal:       {int(available_gib * 1.2 * 1048576)} kB\nMemAvailable:   {int(available_gib * 1048576)} kB\n"
    )
    root = tmp_path / "cgroup"
    (root / "memory").mkdir(parents=True, exist_ok=True)
    for old in (root / "memory.max", root / "memory/memory.limit_in_bytes"):
        old.unlink(missing_ok=True)
    if cgroup_v2 is not None:
        (root / "memory.max").write_text(f"{cgroup_v2}\n")
    if cgroup_v1 is not None:
        (root / "memory/memory.limit_in_bytes").write_text(f"{cgroup_v1}\n")
    env = {
        **os.environ,
        "HOROVOD_BUILD_NPROC": str(cores),
        "HOROVOD_BUILD_MEMINFO": str(meminfo),
        "HOROVOD_BUILD_CGROUP_ROOT": str(root),
        **extra,
    }
    out = subprocess.run(["bash", str(SCRIPT), "--jobs"], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.parametrize(
    "cores, gib, expected",
    [
        (4, 15, 4),  # cpu-smoke (Standard_D4s_v3 class: 4 vCPUs, 16 GiB): one per core, not 8
        (16, 15, 5),  # many cores, little memory: 3 GiB a job
        (2, 64, 2),  # few cores
        (8, 1, 1),  # never below one
    ],
)
def test_jobs_are_bounded_by_cores_and_available_memory(tmp_path, cores, gib, expected):
    assert jobs(tmp_path, cores, gib) == expected


def test_a_container_limit_below_the_hosts_memory_wins(tmp_path):
    """A container build sees the host's /proc/meminfo; its own limit is the cgroup's (v2 memory.max, v1
    memory.limit_in_bytes). "max" and v1's huge number mean no limit."""
    assert jobs(tmp_path, 16, 120, cgroup_v2=9 * GIB) == 3
    assert jobs(tmp_path, 16, 120, cgroup_v1=6 * GIB) == 2
    assert jobs(tmp_path, 16, 120, cgroup_v2="max") == 16
    assert jobs(tmp_path, 16, 120, cgroup_v1=9223372036854771712) == 16


def test_the_memory_per_job_can_be_changed(tmp_path):
    assert jobs(tmp_path, 16, 15, HOROVOD_BUILD_GIB_PER_JOB="5") == 3


def test_an_explicit_job_count_still_wins_and_the_images_leave_it_unset():
    text = SCRIPT.read_text()
    assert 'JOBS=${HOROVOD_BUILD_JOBS:-$(build_jobs)}' in text and 'MAKEFLAGS="-j$JOBS"' in text
    for image in ("pytorch", "tensorflow"):
        assert "HOROVOD_BUILD_JOBS" not in (ROOT / "images" / image / "Dockerfile").read_text(), (
            f"{image}: a fixed job count overrides the bound by the build machine's cores and memory"
        )
