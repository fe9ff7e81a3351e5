"""toolchain/patch_horovod.py is a declared fork (issue 45, item 5): every edit says what kind it is, why (the
upstream issue, or what was seen without it) and what proves it; the speed edits come off as a group."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "toolchain/patch_horovod.py"
_spec = importlib.util.spec_from_file_location("patch_horovod", SCRIPT)  # toolchain/ holds scripts, not a package
patch = sys.modules["patch_horovod"] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(patch)


@pytest.mark.parametrize("cpu_only", [False, True])
def test_every_edit_declares_its_kind_reason_and_proof(cpu_only):
    every = patch.edits(20, cpu_only)
    assert every and len({e.why for e in every}) == len(every), "one declaration per edit"
    assert {e.kind for e in every} == {patch.BUILD, patch.CORRECTNESS, patch.SPEED}
    for e in every:
        assert e.because and e.proof, e.why
        for test in re.findall(r"tests/[\w/]+\.py", e.proof):
            assert (ROOT / test).is_file(), f"{e.why}: proof {test} does not exist"
    unused = set(patch.DECLARED) - {e.why for e in patch.edits(20, True)}
    assert not unused, f"declared, no such edit: {unused}"


def test_the_speed_edits_come_off_as_a_group_and_the_rest_stays():
    full, lean = patch.edits(20, False), patch.edits(20, False, speed=False)
    assert [e for e in full if e.kind != patch.SPEED] == lean
    assert any(e.kind == patch.SPEED for e in full) and not any(e.kind == patch.SPEED for e in lean)
    # what the speed edits change is theirs alone: no build or correctness edit matches text a speed edit writes
    speed_text = "".join(e.new for e in full if e.kind == patch.SPEED)
    assert not [e.why for e in lean if e.old in speed_text and e.old.strip()]


def test_list_prints_every_declaration(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--cxx-standard", "20", "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.count("because: ") == len(patch.edits(20, False)) and "horovod/horovod#3491" in out
    script = (ROOT / "toolchain/build_horovod.sh").read_text()
    assert "HOROVOD_PATCH_SPEED" in script and "$NO_SPEED" in script  # the build's switch for the group
