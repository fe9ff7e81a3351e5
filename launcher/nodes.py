"""The health check's verdict per node, with each node's Azure ML node id.

payloads/healthcheck/ judges every node against its VM size's figures and writes one verdict per node (host,
private IP, each check's figure against its expected value, PASS or FAIL) to its report. This module adds the
Azure ML node id: the compute's node list (REST "Compute - List Nodes", POST .../computes/{name}/listNodes,
read through azure-ai-ml's `ml.compute.list_nodes`) gives each node's nodeId, privateIpAddress,
publicIpAddress, port, nodeState and runId, and a verdict is matched to the node with its private IP (among
nodes running the job, where the job is named). Then it prints the table.

    python -m launcher.nodes REPORT.json --stack-outputs outputs.dev.json --cluster gpu-ib [--job NAME]

REPORT.json is the job's report output (`az ml job download --name NAME --output-name report`). Exit status:
0 every node passed, 1 a node failed, 2 bad input or Azure refused. `run_health_check` runs the whole sequence
before a training job (the launcher's `--health-check`, docs/health-check.md#a-bad-node).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

from azureaccess.errors import JobError
from trainingplatform import vm_sizes

PASS, FAIL = "PASS", "FAIL"
TITLES = {
    vm_sizes.ALLREDUCE_IN_NODE: "all-reduce in node",
    vm_sizes.ALLREDUCE_OVER_IB: "all-reduce over IB",
    vm_sizes.IB_WRITE_BW: "ib_write_bw per card",
}
HEALTHCHECK_JOB = pathlib.Path(__file__).resolve().parents[1] / "jobs" / "healthcheck-allreduce.yaml"
REPORT_OUTPUT, REPORT_FILE = "report", "allreduce.json"


def _first_line(error: BaseException) -> str:
    return next((x.strip() for x in str(error).splitlines() if x.strip()), type(error).__name__)


# The REST fields and AmlComputeNodeInfo's attributes for them. azure-ai-ml 1.35 fills the entity with the REST
# model's as_dict(), whose keys are the REST names: node_id, private_ip_address, ... stay None and nodeId,
# privateIpAddress, ... are set instead (seen in tests/launcher/test_nodes.py against the documented response).
FIELDS = {
    "nodeId": "node_id",
    "privateIpAddress": "private_ip_address",
    "publicIpAddress": "public_ip_address",
    "port": "port",
    "nodeState": "node_state",
    "runId": "run_id",
}


def list_nodes(ml, compute: str) -> list[dict]:
    """The compute's nodes (every page) with the REST reference's field names, whichever spelling the SDK's
    AmlComputeNodeInfo carries them under."""
    out = []
    for n in ml.compute.list_nodes(compute):
        held = vars(n)
        out.append(
            {rest: held.get(attr) if held.get(attr) is not None else held.get(rest) for rest, attr in FIELDS.items()}
        )
    return out


def match(verdicts: list[dict], nodes: list[dict], job: str | None = None) -> list[dict]:
    """Each verdict with `node_id` (None where no single node has its private IP) and `node_note` saying why.
    With `job`, nodes running that job are preferred: the list also holds idle nodes, and an IP freed by a
    node that left can be reused by a new one."""
    out = []
    for v in verdicts:
        ip = v.get("private_ip")
        same = [n for n in nodes if ip and n.get("privateIpAddress") == ip]
        if job:
            running = [n for n in same if n.get("runId") == job]
            same = running or same
        ids = [n["nodeId"] for n in same]
        if len(ids) == 1:
            out.append({**v, "node_id": ids[0], "node_note": None})
        elif not ids:
            why = (
                "the report has no private IP for it"
                if not ip
                else f"no node of the compute has private IP {ip}: it has left the cluster (scaled down or "
                "replaced), or the report is from another cluster"
            )
            out.append({**v, "node_id": None, "node_note": why})
        else:
            out.append({**v, "node_id": None, "node_note": f"ambiguous: nodes {', '.join(ids)} all have IP {ip}"})
    return out


def _no_figure(vm_size: str | None, check: str) -> str | None:
    size = vm_sizes.lookup(vm_size) if vm_size else None
    return vm_sizes.NO_FIGURE.get((size.name, check)) if size else None


def _cell(c: dict) -> str:
    if c.get("figure") is None:
        return c["status"].lower()
    figure = f"{c['figure']:.3g} {c['unit']}"
    if c["status"] in (PASS, FAIL):
        return f"{figure} {'>=' if c['status'] == PASS else '<'} {c['expected']:g} {c['status']}"
    return f"{figure} (not judged)"


def table(report: dict, matched: list[dict]) -> list[str]:
    """One row per node: node id, host, private IP, each check's figure against its expected value, verdict;
    then every FAIL in full, the checks not judged and why, and where the expected figures come from."""
    checks = list(TITLES)
    header = ["node id", "host", "private IP", *TITLES.values(), "verdict"]
    rows = [
        [
            n["node_id"] or "?",
            n["host"],
            n.get("private_ip") or "?",
            *(_cell(n["checks"][c]) for c in checks),
            n["verdict"],
        ]
        for n in matched
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    for n in matched:
        if n["node_note"]:
            lines.append(f"{n['host']}: node id unknown: {n['node_note']}")
        for c in checks:
            v = n["checks"][c]
            if v["status"] == FAIL:
                figure = "no figure" if v.get("figure") is None else f"{v['figure']:.3g} {v['unit']}"
                expected = f", expected at least {v['expected']:g} {v['unit']}" if v.get("expected") else ""
                lines.append(
                    f"{n['node_id'] or n['host']} FAIL: {TITLES[c]} {figure}{expected}"
                    + (f": {v['reason']}" if v.get("reason") else "")
                )
    notes: dict[tuple[str, str], list[str]] = {}
    for n in matched:
        for c in checks:
            v = n["checks"][c]
            if v["status"] not in (PASS, FAIL):
                why = v.get("reason") or ""
                if v.get("expected") is None:
                    why = _no_figure(report.get("vm_size"), c) or why
                notes.setdefault((c, why), []).append(n["node_id"] or n["host"])
    for (c, why), who in notes.items():
        lines.append(f"{TITLES[c]} not judged on {', '.join(who)}: {why}")
    size = vm_sizes.lookup(report.get("vm_size") or "")
    for e in size.health if size else ():
        lines.append(f"expected {TITLES[e.check]}: {e.value:g} {e.unit} from {e.source}")
    return lines


def failed(matched: list[dict]) -> list[dict]:
    return [n for n in matched if n["verdict"] == FAIL]


def verdict_lines(report: dict, matched: list[dict], compute: str) -> tuple[int, list[str]]:
    """(exit status, what to print): the table, and for failed nodes what to do about them."""
    if not report.get("node_verdicts"):
        raise JobError(
            "the report has no node_verdicts: it was written by a health check older than the per-node verdicts"
        )
    lines = table(report, matched)
    bad = failed(matched)
    if bad:
        ids = ", ".join(n["node_id"] or f"{n['host']} (id unknown)" for n in bad)
        lines.append(
            f"{len(bad)} of {len(matched)} nodes of {compute} FAILED: {ids}. Do not train on them: take them out of "
            "the cluster and report them to Azure (docs/health-check.md#a-bad-node)"
        )
        return 1, lines
    if not report.get("passed", True):
        lines.append("every node passed; the job failed elsewhere (its failures: the job's log or the report)")
        return 1, lines
    lines.append(f"all {len(matched)} nodes of {compute} passed")
    return 0, lines


def read_report(path: pathlib.Path) -> dict:
    if path.is_dir():
        found = sorted(path.rglob(REPORT_FILE))
        if not found:
            raise JobError(f"{path} holds no {REPORT_FILE}: the health check wrote none (see the job's log)")
        path = found[0]
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise JobError(f"cannot read the health check's report {path}: {e}") from None


def run_health_check(outputs, on, ml=None) -> int:
    """The launcher's --health-check: run jobs/healthcheck-allreduce.yaml on the job's target `on` (its cluster,
    nodes and processes per node), list the compute's nodes while they still hold the job, print the verdict table. 0 when every node passed
    (then submit the training job right away, while the checked nodes are the cluster's idle ones), 1 when a
    node failed or the check did not finish."""
    from azure.ai.ml.exceptions import JobException
    from azure.core.exceptions import AzureError

    from . import azureml, jobspec

    template = jobspec.read_template(HEALTHCHECK_JOB)
    job = jobspec.fill(template, outputs, on, [], None, HEALTHCHECK_JOB)
    sdk_job = jobspec.validate(job, HEALTHCHECK_JOB)
    ml = ml or azureml.client(outputs)
    compute = on.compute
    azureml.pin_image(sdk_job, outputs, ml)
    try:
        created = ml.jobs.create_or_update(sdk_job)
    except AzureError as e:
        raise JobError("the health check: " + azureml.submission_failure(e, outputs, compute, "")) from None
    print(f"health check {created.name} on {on.nodes} node(s) of {compute}: {created.studio_url}", flush=True)
    try:
        ml.jobs.stream(created.name)
    except JobException:
        pass  # a failed node fails the job: the report says which
    try:
        compute_nodes = list_nodes(ml, compute)  # before the cluster scales the nodes down
        with tempfile.TemporaryDirectory() as tmp:
            ml.jobs.download(created.name, output_name=REPORT_OUTPUT, download_path=tmp)
            report = read_report(pathlib.Path(tmp))
    except AzureError as e:
        print(
            f"error: the health check {created.name} left no readable report or node list "
            f"({_first_line(e)}); see its log: {created.studio_url}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    code, lines = verdict_lines(report, match(report["node_verdicts"], compute_nodes, created.name), compute)
    print("\n".join(lines), flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.nodes", description=__doc__.splitlines()[0])
    p.add_argument("report", type=pathlib.Path, help="the health check's allreduce.json (or a folder holding it)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--stack-outputs", type=pathlib.Path, help="JSON from `pulumi stack output --json`")
    src.add_argument("--stack", help="ask the Pulumi CLI for this stack's outputs")
    p.add_argument("--cluster", help="the compute cluster the check ran on (a key of the stack output `clusters`)")
    p.add_argument("--job", help="the health check's job name: nodes running it are preferred in the match")
    args = p.parse_args(argv)
    from azureaccess import stack

    from . import azureml

    try:
        report = read_report(args.report)
        if args.stack_outputs or args.stack:
            outputs = stack.load_file(args.stack_outputs) if args.stack_outputs else stack.load_from_pulumi(args.stack)
            compute = outputs.cluster(args.cluster).get("compute_name") or args.cluster
            try:
                compute_nodes = list_nodes(azureml.client(outputs), compute)
            except Exception as e:  # noqa: BLE001 - any failure to read Azure: said, the table printed without ids
                raise JobError(f"cannot list the nodes of {compute}: {_first_line(e)}") from None
            matched = match(report.get("node_verdicts") or [], compute_nodes, args.job)
        else:
            compute = "the cluster"
            why = "not looked up (give --stack-outputs and --cluster)"
            matched = [{**v, "node_id": None, "node_note": why} for v in report.get("node_verdicts") or []]
        code, lines = verdict_lines(report, matched, compute)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
