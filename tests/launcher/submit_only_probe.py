"""Run the submission-only commands in a Python where only requirements-submit.txt's packages can be imported.

tests/launcher/test_submit_install.py starts it with this checkout's .venv, which holds everything (torch, Horovod,
TensorFlow, ...), and passes the distributions the submission install has (SUBMIT_ONLY_DISTS, canonical names,
JSON). A finder at the head of sys.meta_path lets each import find its module as usual, then refuses it with the
ModuleNotFoundError of a Python where the package was never installed when the module's file belongs to any other
distribution of site-packages. The standard library, the checkout's own packages and namespace packages pass. So what
runs here is what runs in `python3 -m venv ... && pip install -r requirements-submit.txt -e infra`, with the same
versions. It prints one JSON line: each step's outcome, what was refused, and which of the heavy packages got loaded.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.metadata as metadata
import io
import json
import os
import pathlib
import re
import sys
import sysconfig
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "horovod", "tensorflow", "keras", "tensorboard", "numpy", "PIL", "matplotlib")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


ALLOWED = set(json.loads(os.environ["SUBMIT_ONLY_DISTS"]))
SITE = tuple(
    os.path.normcase(os.path.abspath(p)) + os.sep
    for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
OWNERS: dict[str, str] = {}
for dist in metadata.distributions():
    owner = canonical(dist.metadata["Name"] or "")
    for f in dist.files or ():
        OWNERS[os.path.normcase(os.path.abspath(str(dist.locate_file(f))))] = owner
REFUSED: list[dict] = []


class SubmitOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
            return spec
        origin = os.path.normcase(os.path.abspath(spec.origin))
        if origin.startswith(SITE):
            owner = OWNERS.get(origin)
            if owner not in ALLOWED:
                REFUSED.append({"module": name, "distribution": owner})
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec


sys.meta_path.insert(0, SubmitOnly())
os.chdir(ROOT)
sys.path[:0] = [str(ROOT)]


def step(label: str, action) -> dict:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = action()
    except SystemExit as e:  # argparse's --help
        code = e.code
    except BaseException:  # noqa: BLE001  reported, not raised: the test names the step that failed
        return {"step": label, "ok": False, "error": traceback.format_exc()[-3000:], "stderr": err.getvalue()[-2000:]}
    return {"step": label, "ok": code in (0, None), "code": code, "stdout": out.getvalue()[-400:]}


def main() -> None:
    modules = json.loads(sys.argv[1])
    commands = json.loads(sys.argv[2])
    results = [step(f"import {m}", lambda m=m: importlib.import_module(m) and 0) for m in modules]
    for argv in commands:  # [module whose main(args) runs, *args]
        results.append(step(" ".join(argv), lambda a=argv: importlib.import_module(a[0]).main(a[1:])))
    heavy = sorted(m for m in HEAVY if m in sys.modules)
    print("PROBE " + json.dumps({"results": results, "refused": REFUSED, "heavy_loaded": heavy}))


if __name__ == "__main__":
    main()
