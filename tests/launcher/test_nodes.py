"""The health check's expected figures per VM size are Azure's own, and its verdicts get each node's Azure ML node
id: from the compute's node list (REST "Compute - List Nodes"), matched by private IP, with azure-ai-ml running
for real over a faked HTTP layer (tests/fake_arm.py) answering the REST reference's documented response."""

from __future__ import annotations

import copy
import json
import pathlib
import re
from types import SimpleNamespace

import fake_arm
import fake_azureml
import pytest

from azureaccess import stack
from launcher import interconnect, nodes, target
from payloads.healthcheck import expected as node_figures
from payloads.healthcheck import options, verdicts
from trainingplatform import vm_sizes

ROOT = pathlib.Path(__file__).resolve().parents[2]

# ---- the figures: Azure's conf lines, quoted here from the source, parsed here ----------------------------------

# Azure/azurehpc-health-checks at 0e0a1ac26a64b32ac4dd7632a529638505d3314a (2026-05-01), conf/<size>.conf: the
# lines of the checks the health check runs (all other lines are hardware inventory checks).
AZURE_COMMIT = "0e0a1ac26a64b32ac4dd7632a529638505d3314a"
AZURE_CONF = {
    "Standard_ND96asr_v4": (
        "conf/nd96asr_v4.conf",
        " * || check_nccl_allreduce 228.0 1 8G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml\n"
        " * || check_ib_bw_gdr 180.0\n"
        " * || check_nccl_allreduce_ib_loopback 18.0 1 8G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml\n",
    ),
    "Standard_ND96amsr_A100_v4": (
        "conf/nd96amsr_a100_v4.conf",
        " * || check_nccl_allreduce 228.0 1 16G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml\n"
        "* || check_ib_bw_gdr 180.0\n"
        "* || check_nccl_allreduce_ib_loopback 18.0 1 16G $AZ_NHC_ROOT/topofiles/ndv4-topo.xml\n",
    ),
    "Standard_ND96isr_H100_v5": (
        "conf/nd96isr_h100_v5.conf",
        " * || check_nccl_allreduce 460.0 1 16G $AZ_NHC_ROOT/topofiles/ndv5-topo.xml\n * || check_ib_bw_gdr 380\n",
    ),
    "Standard_ND96isr_H200_v5": (
        "conf/nd96isr_h200_v5.conf",
        " * || check_nccl_allreduce 431.0 1 16G $AZ_NHC_ROOT/topofiles/ndv5-topo.xml\n * || check_ib_bw_gdr 360\n",
    ),
    "Standard_NC96ads_A100_v4": (
        "conf/nc96ads_a100_v4.conf",
        " * || check_nccl_allreduce 25 1 8G $AZ_NHC_ROOT/topofiles/ncv4-topo.xml\n",
    ),
}
# Azure's check function -> the health check's name, and the unit Azure's script compares in.
AZURE_CHECKS = {
    "check_nccl_allreduce": ("allreduce_in_node", "GB/s"),
    "check_nccl_allreduce_ib_loopback": ("allreduce_over_ib", "GB/s"),
    "check_ib_bw_gdr": ("ib_write_bw", "Gb/s"),
}


def azure_figures(conf: str) -> dict[str, tuple[float, str, int]]:
    """{check: (value, unit, message bytes)}: nccl-tests reads 8G as 8 x 2^30 bytes; Azure's ib_write_bw check
    sends 8388608-byte messages (customTests/azure_ib_write_bw_gdr.nhc: MESSAGE_SIZE=8388608)."""
    out = {}
    for line in conf.splitlines():
        words = line.split("||", 1)[1].split()
        check, unit = AZURE_CHECKS[words[0]]
        size = int(words[3].rstrip("G")) * 2**30 if len(words) > 3 else 8388608
        out[check] = (float(words[1]), unit, size)
    return out


def test_sizes_with_azures_figures_are_the_ones_azure_publishes_them_for():
    assert sorted(n for n, s in vm_sizes.CATALOG.items() if s.health) == sorted(AZURE_CONF)


@pytest.mark.parametrize("size", sorted(AZURE_CONF))
def test_the_catalog_carries_azures_figures_with_their_source(size):
    path, conf = AZURE_CONF[size]
    s = vm_sizes.CATALOG[size]
    assert {e.check: (e.value, e.unit, e.message_bytes) for e in s.health} == azure_figures(conf)
    for e in s.health:
        assert e.source.startswith(f"Azure/azurehpc-health-checks {path}@{AZURE_COMMIT[:12]}: ")
        assert e.conf in conf  # the line quoted as Azure wrote it
    assert vm_sizes.AZURE_NHC_COMMIT == AZURE_COMMIT


@pytest.mark.parametrize("size", sorted(AZURE_CONF))
def test_the_health_check_reads_the_catalogs_figures_from_the_launchers_environment(size):
    """The catalog -> the job's environment (launcher/interconnect.py) -> the payload's expectations."""
    s = vm_sizes.CATALOG[size]
    cluster = {"vm_size": size, "gpus_per_node": s.gpus, "infiniband": bool(s.infiniband), "vcpus_per_node": s.vcpus}
    env = interconnect.environment(cluster, s.gpus)
    read = node_figures.parse(env[node_figures.EXPECTED], "env")
    assert {c: (e["value"], e["unit"], e["message_bytes"]) for c, e in read.items()} == azure_figures(
        AZURE_CONF[size][1]
    )
    # Azure's all-reduce in the node runs one process per GPU (mpirun -np <GPU count>); its other figures are per card
    assert {c: e["processes"] for c, e in read.items()} == {
        c: s.gpus if c == "allreduce_in_node" else None for c in read
    }
    # and the payload's default message sizes end at Azure's
    top = max(v[2] for c, v in azure_figures(AZURE_CONF[size][1]).items() if c != "ib_write_bw")
    assert options.message_sizes(None, read)[-1] == top


def test_supported_sizes_without_a_figure_say_why():
    """Where Azure publishes no figure for hardware a size has, the catalog says so rather than invent one."""
    gaps = {
        ("Standard_ND96isr_H100_v5", "allreduce_over_ib"),  # dropped from the conf in c6742502016d (2023-10-13)
        ("Standard_ND96isr_H200_v5", "allreduce_over_ib"),
        ("Standard_NC64as_T4_v3", "allreduce_in_node"),  # no T4 conf at all
    }
    assert set(vm_sizes.NO_FIGURE) == gaps
    for size, check in gaps:
        assert vm_sizes.expected(vm_sizes.CATALOG[size], check) is None
    assert "c6742502016d" in vm_sizes.NO_FIGURE[("Standard_ND96isr_H100_v5", "allreduce_over_ib")]


def test_cpu_and_one_gpu_sizes_get_no_expected_figures():
    for name in ("Standard_D4s_v5", "Standard_NC24ads_A100_v4", "Standard_NC40ads_H100_v5", "Standard_NC4as_T4_v3"):
        s = vm_sizes.CATALOG[name]
        cluster = {"vm_size": name, "gpus_per_node": s.gpus, "infiniband": False, "vcpus_per_node": s.vcpus}
        assert node_figures.EXPECTED not in interconnect.environment(cluster, max(1, s.gpus))


# ---- node ids: the compute's node list, matched by private IP ------------------------------------------------

# The REST reference's example response of Compute - List Nodes (azure-rest-api-specs
# specification/machinelearningservices/resource-manager/Microsoft.MachineLearningServices/stable/2024-04-01/
# examples/Compute/listNodes.json), verbatim but for nextLink, which the example leaves as the word "nextLink":
# here it points at a second page of the same shape.
WORKSPACE = "management.azure.com/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/workspaces/{ws}"
DOCUMENTED = {
    "nodes": [
        {
            "nodeId": "tvm-3601533753_1-20170719t162906z",
            "privateIpAddress": "13.84.190.124",
            "publicIpAddress": "13.84.190.134",
            "port": 50000,
            "nodeState": "running",
            "runId": "2f378a44-38f2-443a-9f0d-9909d0b47890",
        },
        {
            "nodeId": "tvm-3601533753_2-20170719t162906z",
            "privateIpAddress": "13.84.190.124",
            "publicIpAddress": "13.84.190.134",
            "port": 50001,
            "nodeState": "idle",
        },
    ],
    "nextLink": "nextLink",
}
PAGE_2 = {
    "nodes": [
        {
            "nodeId": "tvm-3601533753_3-20261126t101010z",
            "privateIpAddress": "10.0.0.4",
            "publicIpAddress": None,
            "port": 50002,
            "nodeState": "running",
            "runId": "healthcheck-job-1",
        },
        {
            "nodeId": "tvm-3601533753_4-20261126t101010z",
            "privateIpAddress": "10.0.0.5",
            "publicIpAddress": None,
            "port": 50003,
            "nodeState": "running",
            "runId": "healthcheck-job-1",
        },
    ]
}
JOB = "healthcheck-job-1"


@pytest.fixture
def azure(monkeypatch, dev_outputs):
    """Azure's node list for the dev stack's gpu-ib cluster (its Azure ML name, gpu-ib-jvedj), in two pages."""
    outs = stack.load_file(dev_outputs)
    base = WORKSPACE.format(sub=outs["subscription_id"], rg=outs["resource_group"], ws=outs["workspace_name"])
    compute = outs.cluster("gpu-ib")["compute_name"]
    listing = f"{base}/computes/{compute}/listNodes"
    first = copy.deepcopy(DOCUMENTED)
    first["nextLink"] = f"https://{listing}?api-version=2024-04-01&$skiptoken=page2"
    fake = fake_arm.install(monkeypatch)
    fake.on("POST", re.escape(listing), (200, first, {}))
    fake.on("GET", re.escape(listing), (200, PAGE_2, {}))  # azure-core follows nextLink with a GET
    tag = re.escape(outs["registry_login_server"]) + r"/acr/v1/(.+)/_tags/"  # the image's digest (azureml.pin_image)
    fake.on("GET", tag + "([^/]+)", lambda request, m: (200, fake_azureml.tag_properties(m[1], m[2]), {}))
    monkeypatch.setattr("azureaccess.credential.azure_credential", lambda: fake_arm.Credential())
    fake.outputs, fake.compute, fake.listing = outs, compute, listing
    return fake


def test_the_node_list_is_read_from_every_page_with_the_documented_fields(azure):
    from launcher import azureml

    listed = nodes.list_nodes(azureml.client(azure.outputs), azure.compute)
    assert listed[:2] == [{"runId": None, **n} for n in DOCUMENTED["nodes"]]
    assert listed[2:] == PAGE_2["nodes"]
    assert [r.method for r in azure.requests] == ["POST", "GET"]
    assert azure.requests[0].url.split("?")[0] == f"https://{azure.listing}"


def verdict(ip: str, host: str = "h") -> dict:
    return {"host": host, "private_ip": ip, "verdict": "PASS", "checks": {}}


def test_a_verdict_gets_the_node_id_of_the_node_with_its_private_ip():
    listed = [*DOCUMENTED["nodes"], *PAGE_2["nodes"]]
    matched = nodes.match([verdict("10.0.0.5"), verdict("10.0.0.4"), verdict("10.9.9.9"), verdict(None)], listed)
    assert [m["node_id"] for m in matched] == [
        "tvm-3601533753_4-20261126t101010z",
        "tvm-3601533753_3-20261126t101010z",
        None,
        None,
    ]
    assert "no node of the compute has private IP 10.9.9.9: it has left the cluster" in matched[2]["node_note"]
    assert matched[3]["node_note"] == "the report has no private IP for it"


def test_two_nodes_with_one_ip_are_told_apart_by_the_job_they_run():
    """The documented example lists two nodes with the same private IP (one per port): ambiguous, unless one of
    them runs the health check's job."""
    (alone,) = nodes.match([verdict("13.84.190.124")], DOCUMENTED["nodes"])
    assert alone["node_id"] is None and alone["node_note"] == (
        "ambiguous: nodes tvm-3601533753_1-20170719t162906z, tvm-3601533753_2-20170719t162906z all have IP "
        "13.84.190.124"
    )
    (by_job,) = nodes.match([verdict("13.84.190.124")], DOCUMENTED["nodes"], "2f378a44-38f2-443a-9f0d-9909d0b47890")
    assert by_job["node_id"] == "tvm-3601533753_1-20170719t162906z"


# ---- the table, from a report the payload's own judging wrote ----------------------------------------------------


def nd96asr_report(slow_host: str | None = None) -> dict:
    """The report of a health check on two ND96asr_v4 nodes (8 processes each) as payloads/healthcheck/ writes
    it: its judge_nodes on measurements whose figures are set here; `slow_host`'s in-node all-reduce at 150 GB/s
    against Azure's 228."""
    size = vm_sizes.CATALOG["Standard_ND96asr_v4"]
    cluster = {"vm_size": size.name, "gpus_per_node": 8, "infiniband": True, "vcpus_per_node": 96}
    expected = node_figures.parse(interconnect.environment(cluster, 8)[node_figures.EXPECTED], "catalog")
    hosts = ["node-a"] * 8 + ["node-b"] * 8
    facts = [{"host": h, "private_ip": "10.0.0.4" if h == "node-a" else "10.0.0.5"} for h in hosts]
    big = 8 * 2**30
    records = []
    for host, first in (("node-a", 0), ("node-b", 8)):
        busbw = 150 if host == slow_host else 235
        seconds = big * 2 * 7 / 8 / (busbw * 1e9)
        ranks = list(range(first, first + 8))
        records += [
            {"check": "allreduce_in_node", "ranks": ranks, "bytes": big, "seconds": [seconds] * 5, "correct": True}
        ]
    for i in range(8):
        seconds = big / (21 * 1e9)  # 21 GB/s per card pair: bytes x 2(2-1)/2 / time
        records.append(
            {
                "check": "allreduce_over_ib",
                "ranks": [i, 8 + i],
                "bytes": big,
                "seconds": [seconds] * 5,
                "correct": True,
                "nodes": ["node-a", "node-b"],
                "local_index": i,
            }
        )
    cards = [
        {
            "check": "ib_write_bw",
            "host": h,
            "skipped": "the image has no ib_write_bw (perftest; Ubuntu's package perftest)",
        }
        for h in ("node-a", "node-b")
    ]
    judged = verdicts.judge_nodes(facts, records, cards, expected)
    return {"vm_size": size.name, "passed": slow_host is None, "node_verdicts": judged}


def test_the_cli_prints_each_nodes_id_figures_and_verdict_and_exits_1_on_a_bad_node(
    azure, dev_outputs, tmp_path, capsys
):
    report = tmp_path / "allreduce.json"
    report.write_text(json.dumps(nd96asr_report(slow_host="node-b")))
    code = nodes.main([str(report), "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--job", JOB])
    out = capsys.readouterr().out
    assert code == 1, out
    rows = out.splitlines()
    assert re.match(
        r"node id +host +private IP +all-reduce in node +all-reduce over IB +ib_write_bw per card +verdict", rows[0]
    )
    assert re.match(
        r"tvm-3601533753_3-20261126t101010z +node-a +10\.0\.0\.4 +235 GB/s >= 228 PASS +21 GB/s >= 18 PASS +skipped +PASS$",
        rows[1],
    )
    assert re.match(
        r"tvm-3601533753_4-20261126t101010z +node-b +10\.0\.0\.5 +150 GB/s < 228 FAIL +21 GB/s >= 18 PASS +skipped +FAIL$",
        rows[2],
    )
    assert "tvm-3601533753_4-20261126t101010z FAIL: all-reduce in node 150 GB/s, expected at least 228 GB/s" in out
    assert (
        "ib_write_bw per card not judged on tvm-3601533753_3-20261126t101010z, tvm-3601533753_4-20261126t101010z: the image has no ib_write_bw"
        in out
    )
    assert (
        "expected all-reduce in node: 228 GB/s from Azure/azurehpc-health-checks conf/nd96asr_v4.conf@0e0a1ac26a64: "
        "check_nccl_allreduce 228.0 1 8G"
    ) in out
    assert "1 of 2 nodes of gpu-ib-jvedj FAILED: tvm-3601533753_4-20261126t101010z. Do not train on them" in out
    assert "docs/health-check.md#a-bad-node" in out


def test_a_check_without_azures_figure_says_why_in_the_table():
    report = nd96asr_report()
    report["vm_size"] = "Standard_ND96isr_H100_v5"
    for v in report["node_verdicts"]:
        v["checks"]["allreduce_over_ib"].update(status="NOT JUDGED", expected=None, reason="no expected figure")
    matched = nodes.match(report["node_verdicts"], PAGE_2["nodes"])
    lines = nodes.table(report, matched)
    assert any(
        line.startswith("all-reduce over IB not judged on tvm-3601533753_3-20261126t101010z, tvm-3601533753_4")
        and "no check_nccl_allreduce_ib_loopback since commit c6742502016d" in line
        for line in lines
    ), lines


# ---- --health-check: the check first, training only if every node passed ---------------------------------------


class Jobs:
    """azure-ai-ml's job operations, faked in Python (submission over HTTP is tests/launcher/fake_azureml.py's):
    the health check job ends as `status`, and its report output holds `report`."""

    def __init__(self, report: dict, fails: bool):
        self.report, self.fails, self.created = report, fails, []

    def create_or_update(self, job):
        self.created.append(job)
        return SimpleNamespace(name=JOB, studio_url="https://ml.azure.com/runs/" + JOB)

    def stream(self, name):
        from azure.ai.ml.exceptions import JobException

        if self.fails:
            raise JobException(message="the job failed", no_personal_data_message="failed")

    def download(self, name, output_name, download_path):
        folder = pathlib.Path(download_path) / "named-outputs" / output_name
        folder.mkdir(parents=True)
        (folder / "allreduce.json").write_text(json.dumps(self.report))


@pytest.mark.parametrize("slow", [None, "node-a"])
def test_health_check_first_runs_the_check_on_the_training_jobs_nodes_and_gates_on_every_node(azure, capsys, slow):
    from launcher import azureml

    real = azureml.client(azure.outputs)
    jobs = Jobs(nd96asr_report(slow_host=slow), fails=slow is not None)
    ml = SimpleNamespace(jobs=jobs, compute=real.compute)  # the node list goes through the SDK and HTTP
    code = nodes.run_health_check(azure.outputs, target.resolve(azure.outputs, "gpu-ib", 2, None), ml=ml)
    out = capsys.readouterr().out
    (job,) = jobs.created
    assert job.display_name == "healthcheck-allreduce" and job.resources.instance_count == 2
    assert job.environment.image.endswith(f"/training/pytorch@{fake_azureml.DIGEST}")  # what runs is what was built
    assert job.distribution.process_count_per_instance == 8  # one per GPU: Azure's in-node figure is for all 8
    assert job.environment_variables[node_figures.EXPECTED].startswith("allreduce_in_node=228@8589934592/8")
    if slow:
        assert code == 1
        assert "1 of 2 nodes of gpu-ib-jvedj FAILED: tvm-3601533753_3-20261126t101010z" in out
    else:
        assert code == 0 and "all 2 nodes of gpu-ib-jvedj passed" in out


@pytest.mark.parametrize("verdict", [0, 1])
def test_the_launchers_health_check_option_submits_only_after_every_node_passed(
    dev_outputs, monkeypatch, capsys, verdict
):
    """`python -m launcher JOB --health-check`: the check runs on the job's cluster and node count before the
    submission, and a failed node stops the submission with the check's exit status."""
    from launcher import __main__ as cli
    from launcher import azureml

    calls = []
    monkeypatch.setattr(
        nodes, "run_health_check", lambda outputs, on: calls.append(("check", on.name, on.nodes)) or verdict
    )
    monkeypatch.setattr(azureml, "submit", lambda *a, **kw: calls.append(("submit",)) or 0)
    job = str(pathlib.Path(__file__).resolve().parents[2] / "jobs/pytorch-resnet50-synthetic.yaml")
    args = [job, "--stack-outputs", str(dev_outputs), "--cluster", "gpu-ib", "--nodes", "2", "--skip-quota-check"]
    code = cli.main([*args, "--health-check"])
    assert calls == ([("check", "gpu-ib", 2), ("submit",)] if verdict == 0 else [("check", "gpu-ib", 2)])
    assert code == verdict
    if verdict:
        assert "the training job was not submitted" in capsys.readouterr().err
    # Locally there is no cluster to check: refused, naming the local way.
    assert cli.main([job, "--target", "local", "--health-check"]) == 2
    assert "jobs/healthcheck-allreduce.yaml --target local" in capsys.readouterr().err
