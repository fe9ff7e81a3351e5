"""toolchain/bootstrap.sh refuses a first install on a disk without room for it, before pip starts."""

import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_first_install_without_disk_space_is_refused_with_the_fix(tmp_path):
    venv = tmp_path / "venv"
    env = dict(os.environ, VENV=str(venv), BOOTSTRAP_MIN_FREE_GB="100000000", HOROVOD_WITHOUT_MPI="1")
    done = subprocess.run(
        ["bash", str(ROOT / "toolchain/bootstrap.sh")], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr
    assert "a first install needs about 100000000 GB" in done.stderr
    assert "ln -s" in done.stderr  # the fix is named
    assert "installing torch" not in done.stderr  # refused before pip ran
    assert not venv.exists()  # refused before anything was created
