"""The cost ledger of one job: where its time and its money went, from the job's own history.

    python -m launcher cost JOB_NAME --stack-outputs outputs.dev.json [--json cost.json]
        [--status-log LOG_ANALYTICS_WORKSPACE_ID] [--metrics metrics.json] [--gpu-images-per-sec R]
        [--price-per-node-hour USD]

The launcher also prints it at the end of a job it followed. history.py reads what Azure recorded (the job, its
cluster, run history, the status log, the output folder); ledger.py turns it into seconds and dollars per phase
(pure arithmetic); render.py prints it; local.py splits a local run's time the same way.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from azureaccess.errors import JobError
from azureaccess.stack import StackOutputs

from .history import gather
from .ledger import ledger
from .render import render

STATUS_LOG_OUTPUT = "status_log_workspace_id"


def after_watch(ml, name: str, outputs: StackOutputs) -> dict | None:
    """The ledger at the end of a followed job, printed and returned; a failure to compute it is one line (and None),
    never the job's exit status."""
    try:
        found = ledger(gather(name, outputs, ml=ml))
        print(render(found), flush=True)
        return found
    except JobError as e:
        print(f"cost: not computed: {e}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("cost: skipped (interrupted)", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001  the job has ended; its ledger is extra
        print(
            f"cost: not computed ({type(e).__name__}: {e}); later: python -m launcher cost {name} --stack-outputs ...",
            file=sys.stderr,
            flush=True,
        )
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher cost",
        description="The cost ledger of an Azure ML job: time and money per phase (docs/job-cost.md#what-a-job-cost).",
    )
    p.add_argument("job", help="the job's name (its run id), e.g. witty_jackal_3d4kq79d3v")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--stack-outputs", type=pathlib.Path, help="JSON from `pulumi stack output --json`")
    src.add_argument("--stack", help="ask the Pulumi CLI for this stack's outputs")
    p.add_argument("--json", type=pathlib.Path, metavar="PATH", help="also write the ledger as JSON here")
    p.add_argument(
        "--status-log",
        metavar="WORKSPACE_ID",
        help="the Log Analytics workspace (its id, a GUID) that receives the Azure ML workspace's "
        f"AmlRunStatusChangedEvent log: splits queue from preparation and places each requeue (default: the stack "
        f"output {STATUS_LOG_OUTPUT})",
    )
    p.add_argument("--metrics", type=pathlib.Path, help="a metrics.json to use instead of the output folder's")
    p.add_argument(
        "--gpu-images-per-sec",
        type=float,
        help="one GPU's measured images/sec for this model and batch: the planner's estimate beside the ledger",
    )
    p.add_argument("--price-per-node-hour", type=float, metavar="USD", help="instead of launcher/vm_prices.csv")
    return p


def default_status_log(given: str | None, outputs: StackOutputs) -> tuple[str | None, str]:
    """(the Log Analytics workspace id to read the status log from, where it came from): --status-log, else the
    stack output (the platform stack's own Log Analytics workspace, which its diagnostic setting feeds), else none."""
    if given is not None:
        return given, "--status-log"
    found = outputs.values.get(STATUS_LOG_OUTPUT)
    if found:
        return str(found), f"the stack output {STATUS_LOG_OUTPUT}"
    return None, "none"


def main(argv: list[str]) -> int:
    from azureaccess import stack

    args = parser().parse_args(argv)
    try:
        outputs = stack.load_file(args.stack_outputs) if args.stack_outputs else stack.load_from_pulumi(args.stack)
        status_log, status_log_from = default_status_log(args.status_log, outputs)
        facts = gather(
            args.job,
            outputs,
            status_log=status_log,
            metrics_file=args.metrics,
            gpu_images_per_sec=args.gpu_images_per_sec,
            price_per_node_hour=args.price_per_node_hour,
            status_log_from=status_log_from,
        )
        if status_log is None:
            facts.notes.append(
                f"no status log: the stack outputs have no {STATUS_LOG_OUTPUT} (a stack deployed before the "
                "workspace's diagnostic setting: run pulumi up and write the outputs again), and no --status-log "
                "WORKSPACE_ID was given"
            )
        book = ledger(facts)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(book))
    if args.json:
        args.json.write_text(json.dumps(book, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
