"""Review aid: print what a stack would declare, without Azure or the Pulumi CLI.

    python -m trainingplatform.review Pulumi.dev.yaml > infra/review/dev.txt
    python -m trainingplatform.review data-stack/Pulumi.dev.yaml > infra/review/data-dev.txt
    python -m trainingplatform.review Pulumi.dev.yaml --outputs > infra/review/dev-outputs.json

A stack file in infra/data-stack/ is the data stack's (project azure-horovod-training-data); any other is
the platform's, rendered over the data stack of the same name. The program runs under mocks; every
resource is listed with its settings, sorted, one setting a line, so a pull request that changes the
platform shows the change as a diff of `infra/review/<stack>.txt` (the tests fail when that file is out
of date). Values Azure would compute appear as mock placeholders.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from . import access, config, dataconfig, mocked


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k in sorted(value):
            yield from _flatten(value[k], f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, json.dumps(value, sort_keys=True)


@contextlib.contextmanager
def _as_a_person():
    """The render is what the stack declares, whoever runs it: without `users`, the program refuses a service
    principal's sign-in (access.py: ARM_* variables, the Azure CLI's login), which a CI agent often has. The stack
    file's own provider settings still count."""
    saved = {k: os.environ.pop(k) for k in (*access.SP_ENVIRONMENT, "AZURE_CONFIG_DIR") if k in os.environ}
    with tempfile.TemporaryDirectory(prefix="no-azure-cli-") as empty:
        os.environ["AZURE_CONFIG_DIR"] = empty
        try:
            yield
        finally:
            os.environ.pop("AZURE_CONFIG_DIR", None)
            os.environ.update(saved)


def render(stack_file: pathlib.Path) -> str:
    with _as_a_person():
        return _render(stack_file)


def _render(stack_file: pathlib.Path) -> str:
    stack = stack_file.name.removeprefix("Pulumi.").removesuffix(".yaml")
    if is_data_stack(stack_file):
        project = dataconfig.PROJECT
        raw, location = mocked.read_stack_file(stack_file, project)
        mocks, outputs = mocked.run_data(raw, stack, location)
    else:
        project = config.PROJECT
        raw, location = mocked.read_stack_file(stack_file)
        mocks, outputs = mocked.run(raw, stack, location)
    lines = [
        f"# {project} stack {stack}: {len(mocks.resources)} resources "
        "(rendered under mocks by trainingplatform.review; ids are placeholders)",
        "",
    ]
    for r in sorted(mocks.resources, key=lambda r: (r.type, r.name)):
        marks = ("  [protected]" if r.name in mocks.protected else "") + (
            "  [retained on destroy]" if r.name in mocks.retained else ""
        )
        lines.append(f"{r.type} {r.name}{marks}")
        lines.extend(f"    {k} = {v}" for k, v in _flatten(r.inputs) if not k.startswith("tags."))
        lines.append("")
    lines.append("# stack outputs")
    lines.extend(f"    {k} = {v}" for k, v in _flatten(outputs))
    return "\n".join(lines) + "\n"


# The key that marks outputs rendered under mocks (azureaccess/stack.py reads the same name): the launcher fills and
# prints jobs from them (--dry-run) and refuses to submit, check or cost anything with them.
RENDERED = "rendered_under_mocks"


def rendered_outputs(stack_file: pathlib.Path) -> dict:
    """The platform stack's outputs as the mocked program produces them, shaped like `pulumi stack output --json`,
    marked as rendered: what a newcomer without Azure passes to `python -m launcher ... --dry-run`."""
    if is_data_stack(stack_file):
        raise config.ConfigError(f"{stack_file}: the data stack's outputs feed the platform, not the launcher")
    with _as_a_person():
        raw, location = mocked.read_stack_file(stack_file)
        _, outputs = mocked.run(raw, stack_file.name.removeprefix("Pulumi.").removesuffix(".yaml"), location)
    return {
        RENDERED: f"by trainingplatform.review from {stack_file.name} under mocks: ids are placeholders, no stack "
        "is deployed (for --dry-run only)",
        **outputs,
    }


def is_data_stack(stack_file: pathlib.Path) -> bool:
    return stack_file.resolve().parent == mocked.DATA_DIR


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainingplatform.review", description=__doc__.splitlines()[0])
    ap.add_argument("stack_file", type=pathlib.Path, help="Pulumi.<stack>.yaml")
    ap.add_argument(
        "--outputs",
        action="store_true",
        help="print the platform stack's rendered outputs as JSON (for python -m launcher ... --dry-run) instead",
    )
    args = ap.parse_args(argv)
    try:
        if args.outputs:
            sys.stdout.write(json.dumps(rendered_outputs(args.stack_file), indent=2, sort_keys=True) + "\n")
            return 0
        sys.stdout.write(render(args.stack_file))
    except (config.ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
