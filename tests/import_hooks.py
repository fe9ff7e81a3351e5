"""For the test hooks (tests/gpu_rules, tests/nudge), whose sitecustomize runs at a process's start-up: call a
function on a module right after that module is imported, without importing it (or torch) early."""

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


def after_import(name: str, then: Callable) -> None:
    sys.meta_path.insert(0, _After(name, then))


class _After(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, then: Callable):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec
