"""Stack outputs: the contract between `pulumi up` and the tools that use the platform (submission, doctor, the data
tools; see infra/trainingplatform/program.py)."""

from __future__ import annotations

import json
import pathlib
import subprocess
from dataclasses import dataclass

from .errors import JobError

REQUIRED = ("subscription_id", "resource_group", "workspace_name", "registry_login_server", "clusters", "datastores")


# Outputs rendered under mocks by scripts/review-infra (infra/trainingplatform/review.py, RENDERED) carry this key:
# good for filling and printing a job (--dry-run), never for Azure.
RENDERED = "rendered_under_mocks"


@dataclass(frozen=True)
class StackOutputs:
    values: dict

    @property
    def rendered(self) -> bool:
        return RENDERED in self.values

    def __getitem__(self, key: str):
        return self.values[key]

    def cluster(self, name: str | None) -> dict:
        clusters = self.values["clusters"]
        if name is None:
            raise JobError(f"--cluster is required for Azure ML: one of {', '.join(sorted(clusters))}")
        if name not in clusters:
            raise JobError(
                f"unknown cluster {name!r}: the stack declares {', '.join(sorted(clusters)) or 'none'} "
                "(add it to `clusters` in Pulumi.<stack>.yaml and run pulumi up)"
            )
        return clusters[name]

    def datastore(self, role: str) -> str:
        return self.values["datastores"][role]["name"]

    def blob_container(self, role: str, credential):
        """azure-storage-blob's client of the `role` datastore's container (datastores.<role>.account, .container)."""
        from azure.storage.blob import ContainerClient

        store = self.values["datastores"][role]
        return ContainerClient(
            f"https://{store['account']}.blob.core.windows.net", store["container"], credential=credential
        )


def parse(values: object, source: str) -> StackOutputs:
    if not isinstance(values, dict):
        raise JobError(f"{source}: expected a JSON object of stack outputs")
    missing = [k for k in REQUIRED if not values.get(k)]
    if missing:
        raise JobError(
            f"{source} lacks stack outputs {', '.join(missing)}: run `pulumi up` for the stack, then "
            "`pulumi stack output --json > outputs.<stack>.json`"
        )
    for role in ("data", "logs"):
        if not (values["datastores"].get(role) or {}).get("name"):
            raise JobError(
                f"{source}: datastores.{role}.name is missing: the stack is older than this tool; run pulumi up"
            )
    return StackOutputs(values)


def load_file(path: pathlib.Path, rendered_ok: bool = False) -> StackOutputs:
    """`rendered_ok`: outputs rendered under mocks are accepted (the launcher's --dry-run); anything that would
    reach Azure with them is refused here, naming the file and the real way to get outputs."""
    outputs = _load_file(path)
    if outputs.rendered and not rendered_ok:
        raise JobError(
            f"{path} holds outputs rendered under mocks by scripts/review-infra, not a deployed stack's: use it "
            "with --dry-run, or write a deployed stack's outputs with "
            f"`pulumi stack output --json --stack <stack> > outputs.<stack>.json`"
        )
    return outputs


def _load_file(path: pathlib.Path) -> StackOutputs:
    if not path.is_file():
        raise JobError(
            f"stack outputs file {path} not found: write it with `pulumi stack output --json --stack <stack> > {path}`"
        )
    try:
        return parse(json.loads(path.read_text()), str(path))
    except json.JSONDecodeError as e:
        raise JobError(f"{path} is not JSON ({e}): write it with `pulumi stack output --json`") from None


def load_from_pulumi(stack: str) -> StackOutputs:
    """Ask the Pulumi CLI (needs it installed and logged in to the stack's backend)."""
    try:
        proc = subprocess.run(
            ["pulumi", "stack", "output", "--json", "--stack", stack], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise JobError("the Pulumi CLI is not installed: install it, or pass --stack-outputs FILE") from None
    if proc.returncode != 0:
        raise JobError(f"`pulumi stack output --stack {stack}` failed: {proc.stderr.strip()}")
    try:
        values = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        # e.g. a CLI that printed a warning or an update notice before the JSON
        raise JobError(
            f"`pulumi stack output --json --stack {stack}` did not print JSON ({e}; it began "
            f"{proc.stdout[:60]!r}): run it yourself, save the JSON and pass --stack-outputs FILE"
        ) from None
    return parse(values, f"stack {stack}")
