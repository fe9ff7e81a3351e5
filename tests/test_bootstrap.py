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


def test_the_plan_says_compile_when_the_cached_part_was_built_with_another_patch(tmp_path):
    """bootstrap.sh's opening line (what it will do, how long) takes a part as cached only when a cache folder's
    key.txt names its framework's version and today's toolchain/patch_horovod.py (build_horovod.sh writes both): a
    changed patch is a new build. Before, it matched the version alone and promised a minute, then compiled."""
    import hashlib

    script = (ROOT / "toolchain/bootstrap.sh").read_text()
    function = script[script.index("PATCH_SUM=") : script.index("\n}\n", script.index("part_cached()")) + 3]
    today = hashlib.sha256((ROOT / "toolchain/patch_horovod.py").read_bytes()).hexdigest()[:16]

    def cached(framework: str, version: str, patch: str) -> bool:
        cache = tmp_path / patch / "part"
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "key.txt").write_text(f"0.28.1 r1 cp311 torch=2.14.1+cpu mpi=x gpu= cxx=20\npatch {patch}\n")
        run = f"ROOT={ROOT}; {function}\npart_cached {framework} {version} && echo yes || echo no"
        env = dict(os.environ, HOROVOD_WHEEL_CACHE=str(cache.parent))
        return subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True).stdout.strip() == "yes"

    assert cached("torch", "2.14.1", today)
    assert not cached("torch", "2.14.1", "0123456789abcdef"), "a part built with another patch is not cached"
    assert not cached("tf", "2.15.1", today)
    build = (ROOT / "toolchain/build_horovod.sh").read_text()
    assert 'echo "patch $(patch_sum)"; } >"$out/key.txt"' in build  # what the plan reads is what the build writes
