"""`python -m azurecheck preflight --stack dev [--data-stack dev]` and `python -m azurecheck doctor --stack dev`;
`python -m launcher preflight|doctor` is the same command."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys

from azureaccess import stack as stack_outputs
from azureaccess.errors import JobError

COMMANDS = ("preflight", "doctor")


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "preflight: before `pulumi up`, check the subscription, resource providers, your permissions, the hub "
            "VNet (hub mode) and every cluster's quota against Pulumi.<stack>.yaml, and with --data-stack your "
            "rights for infra/data-stack/Pulumi.<stack>.yaml. doctor: after it, check that you can use the deployed "
            "platform from here (workspace DNS, datastores, code upload, images, quota)."
        ),
    )
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("preflight", help="before pulumi up: reads Pulumi.<stack>.yaml")
    pre.add_argument("--stack", help="the platform stack, e.g. dev (reads Pulumi.<stack>.yaml)")
    pre.add_argument(
        "--data-stack",
        help="the data stack, e.g. dev (reads infra/data-stack/Pulumi.<stack>.yaml); with --stack, both are checked",
    )
    doc = sub.add_parser("doctor", help="after pulumi up: reads the stack outputs")
    src = doc.add_mutually_exclusive_group(required=True)
    src.add_argument("--stack-outputs", type=pathlib.Path, help="JSON from `pulumi stack output --json`")
    src.add_argument("--stack", help="ask the Pulumi CLI for this stack's outputs")
    return p


def main(argv: list[str], prog: str = "python -m azurecheck") -> int:
    """Run one command; 2 with the problem named when the stack file or outputs cannot be used."""
    try:
        return run(parser(prog), argv)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(p: argparse.ArgumentParser, argv: list[str]) -> int:
    args = p.parse_args(argv)
    if args.command == "preflight" and not (args.stack or args.data_stack):
        p.error("preflight needs --stack, --data-stack or both")
    # azure-identity logs every credential it tried as a WARNING; each finding already says what failed
    logging.getLogger("azure").setLevel(logging.ERROR)
    if args.command == "preflight":
        from . import preflight, stackfile

        platform = stackfile.read(args.stack) if args.stack else None
        data = stackfile.read_data(args.data_stack) if args.data_stack else None
        return preflight.run(platform, data=data)
    from . import doctor

    outputs = (
        stack_outputs.load_file(args.stack_outputs)
        if args.stack_outputs
        else stack_outputs.load_from_pulumi(args.stack)
    )
    return doctor.run(outputs)
