"""The cost ledger (launcher/cost/, `python -m launcher cost`) against recorded job histories.

Azure is replaced at the network boundary (tests/fake_arm.py answers through requests' adapter), so azure-ai-ml,
azure-storage-blob and azure-core run for real. Each history is written in the documented shapes: ARM "Jobs - Get"
(a CommandJob) and "Compute - Get" (AmlCompute: vmSize, vmPriority, scaleSettings), run history's run details
(createdTimeUtc, startTimeUtc, endTimeUtc, computeDuration as a .NET TimeSpan, lastStartTimeUtc, currentAttemptId,
compute), the Log Analytics query API's tables for AmlRunStatusChangedEvent, and Blob storage's Get Blob and List
Blobs (with versions): cost_helpers.py's Workspace. Every expected figure is worked out here from the recorded times
and the price table's row, never by calling the ledger's own arithmetic. The ledger at the end of a watched job and of
a local run: test_cost_watched.py.
"""

import datetime as dt
import json
import re

import fake_arm
import pytest
from cost_helpers import (
    EPOCH_IMAGES,
    GPU_SIZE,
    LOG_WS,
    NAME,
    PLAIN,
    PLAIN_EPOCHS,
    Workspace,
    at,
    gpu_rate,
    iso,
    metrics_json,
    price_row,
    seconds,
    timespan,
)

from azureaccess import stack
from launcher import __main__ as cli
from launcher import prices
from launcher.cost import history
from launcher.cost.ledger import clock


@pytest.fixture
def older_outputs(dev_outputs, tmp_path):
    """The outputs of a dev stack deployed before its diagnostic setting: no status_log_workspace_id."""
    values = json.loads(dev_outputs.read_text())
    del values["status_log_workspace_id"]
    path = tmp_path / "outputs.older.json"
    path.write_text(json.dumps(values))
    return path


@pytest.fixture
def workspace(monkeypatch, dev_outputs):
    fake = fake_arm.install(monkeypatch)
    monkeypatch.setattr("azure.identity.DefaultAzureCredential", lambda **kw: fake_arm.Credential())
    return Workspace(fake, json.loads(dev_outputs.read_text()))


def ledger_of(dev_outputs, tmp_path, capsys, *extra, name=NAME):
    """`python -m launcher cost NAME ... --json PATH`: (exit status, printed text, the JSON it wrote)."""
    out = tmp_path / "cost.json"
    code = cli.main(["cost", name, "--stack-outputs", str(dev_outputs), "--json", str(out), *extra])
    printed = capsys.readouterr()
    return code, printed.out, json.loads(out.read_text()) if out.exists() else None, printed.err


# ---- a plain completed job ------------------------------------------------------------------------------------------


def record_plain(workspace, status_log=True):
    workspace.job(NAME, "Completed", at("09:00"))
    workspace.run(NAME, "Completed", at("09:00"), at("09:09"), at("10:40"), held=seconds("09:09", "10:40"))
    if status_log:
        workspace.status_log(NAME, PLAIN)
    workspace.outputs_folder(
        NAME,
        metrics_json(PLAIN_EPOCHS, 3, startup=95.5),
        [(1, "09:40:00", True), (2, "10:09:00", True), (3, "10:38:30", True)],
    )


def test_a_completed_job_splits_its_time_and_prices_the_held_nodes(workspace, dev_outputs, tmp_path, capsys):
    record_plain(workspace)
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--status-log", LOG_WS)
    region, dedicated, low, date = price_row(GPU_SIZE, "westeurope")
    rate = gpu_rate(low, dedicated)
    held = seconds("09:09", "10:40")  # Running and Finalizing
    assert code == 0
    assert book["phases"]["queue"]["seconds"] == seconds("09:00", "09:00:05") + seconds("09:01", "09:09")
    assert book["phases"]["preparation"]["seconds"] == seconds("09:00:05", "09:01")
    assert book["phases"]["queue"]["usd"] == 0 and "scales to zero" in book["phases"]["queue"]["note"]
    assert book["phases"]["startup"]["seconds"] == pytest.approx(95.5)
    assert book["phases"]["training"]["seconds"] == pytest.approx(held - 95.5)
    assert book["phases"]["lost_to_preemption"]["seconds"] == 0
    assert book["total"]["usd"] == pytest.approx(held * rate)
    assert book["idle_before_scale_down"]["usd_at_most"] == pytest.approx(600 * rate)  # PT10M
    assert book["per"]["usd_per_epoch"] == pytest.approx(held * rate / 3)
    assert book["per"]["usd_per_million_images"] == pytest.approx(held * rate / (3 * EPOCH_IMAGES) * 1e6)
    assert book["projection"] is None  # it ended
    # the price's row, region and date are said, and that it is not the job's region when it is not
    assert book["price"]["usd_per_node_hour"] == (low if low is not None else dedicated)
    assert book["price"]["region"] == region and book["price"]["date"] == date
    assert f"in {region}, dated {date}" in out
    assert ("NOT the job's region (westeurope)" in out) == (region != "westeurope")
    assert f"${held * rate:,.2f}" in out.split("\ntotal")[1].splitlines()[0]
    assert workspace.status_queries and f'RunId == "{NAME}"' in workspace.status_queries[0]


def test_without_the_status_log_run_history_gives_the_totals(workspace, older_outputs, tmp_path, capsys):
    record_plain(workspace, status_log=False)
    code, out, book, _ = ledger_of(older_outputs, tmp_path, capsys)
    region, dedicated, low, _ = price_row(GPU_SIZE, "westeurope")
    held = seconds("09:09", "10:40")  # computeDuration
    created = at("09:00") + dt.timedelta(microseconds=123456)  # createdTimeUtc as recorded, 7 digits
    assert code == 0
    assert book["phases"]["queue"]["seconds"] == pytest.approx((at("09:09") - created).total_seconds())
    assert book["phases"]["preparation"]["seconds"] is None
    assert "includes preparation" in book["phases"]["queue"]["note"]
    assert book["total"]["usd"] == pytest.approx(held * gpu_rate(low, dedicated))
    assert "run history only" in out
    assert workspace.log_queries() == [] and "status log" not in book["sources"]
    assert any("no status_log_workspace_id" in n and "--status-log" in n for n in book["notes"])


# ---- where the status log is read: --status-log, else the stack output ------------------------------------------


def test_without_the_option_the_ledger_reads_the_status_log_the_stack_declares(
    workspace, dev_outputs, tmp_path, capsys
):
    # The platform stack sends AmlRunStatusChangedEvent to its own Log Analytics workspace and names that workspace's
    # customerId in the output status_log_workspace_id (tests/infra/test_program.py): `cost` reads it from there.
    stack_ws = workspace.outputs["status_log_workspace_id"]
    assert stack_ws != LOG_WS
    record_plain(workspace, status_log=False)
    workspace.status_log(NAME, PLAIN, workspace_id=stack_ws)
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys)
    assert code == 0 and workspace.log_queries() == [stack_ws]
    assert book["phases"]["preparation"]["seconds"] == seconds("09:00:05", "09:01"), "split by the status log"
    assert book["history"].startswith("status log")
    said = f"Log Analytics workspace {stack_ws} (the stack output status_log_workspace_id): 7 status change(s)"
    assert book["sources"]["status log"] == said and f"status log: {said}" in out
    # --status-log still wins, and says so.
    workspace.status_log(NAME, PLAIN)
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--status-log", LOG_WS)
    assert code == 0 and workspace.log_queries() == [stack_ws, LOG_WS]
    assert book["sources"]["status log"] == f"Log Analytics workspace {LOG_WS} (--status-log): 7 status change(s)"


def test_a_status_log_the_user_may_not_read_is_a_note_naming_the_role(workspace, dev_outputs, tmp_path, capsys):
    stack_ws = workspace.outputs["status_log_workspace_id"]
    record_plain(workspace, status_log=False)
    denied = {"error": {"code": "InsufficientAccessError", "message": "The provided credentials have insufficient "
              "access to perform the requested operation"}}  # fmt: skip
    workspace.fake.on("POST", rf"api\.loganalytics\.io/v1/workspaces/{stack_ws}/query", (403, denied, {}))
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys)
    assert code == 0 and "run history only" in out, "the ledger goes on with run history"
    (note,) = [n for n in book["notes"] if "status log not read" in n]
    assert f"{stack_ws} (the stack output status_log_workspace_id)" in note and "Log Analytics Reader" in note


# ---- a job preempted twice ----------------------------------------------------------------------------------------

PREEMPTED = [
    ("09:00:00", "NotStarted"),
    ("09:00:02", "Starting"),
    ("09:00:05", "Preparing"),
    ("09:01:00", "Queued"),
    ("09:09:00", "Running"),
    ("09:55:00", "Queued"),  # preempted: back in the queue under the same name
    ("10:05:00", "Running"),
    ("11:20:00", "Queued"),  # preempted again
    ("11:21:00", "Preparing"),
    ("11:22:00", "Queued"),
    ("11:40:00", "Running"),
    ("12:50:00", "Finalizing"),
    ("12:51:00", "Completed"),
]
# checkpoints completed: epoch 1 in the first stretch, 2 and 3 in the second, 4 and 5 in the last; the payload
# keeps 3, so epochs 1 and 2 are previous versions only
PREEMPTED_MARKERS = [
    (1, "09:36:40", False),
    (2, "10:33:20", False),
    (3, "10:59:10", True),
    (4, "12:08:00", True),
    (5, "12:36:00", True),
]
PREEMPTED_EPOCHS = [(1, 1560.0), (2, 1590.0), (3, 1530.0), (4, 1580.0), (5, 1575.0)]


def record_preempted(workspace, markers=True):
    workspace.job(NAME, "Completed", at("09:00"))
    held = seconds("09:09", "09:55") + seconds("10:05", "11:20") + seconds("11:40", "12:51")
    workspace.run(
        NAME,
        "Completed",
        at("09:00"),
        at("09:09"),
        at("12:51"),
        held=held,
        lastStartTimeUtc=iso(at("11:40")),
        currentAttemptId=3,
    )
    workspace.status_log(NAME, PREEMPTED)
    workspace.outputs_folder(
        NAME, metrics_json(PREEMPTED_EPOCHS, 5, startup=95.5), PREEMPTED_MARKERS if markers else []
    )


def test_a_job_preempted_twice_loses_the_time_after_each_last_checkpoint(workspace, dev_outputs, tmp_path, capsys):
    record_preempted(workspace)
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--status-log", LOG_WS)
    _, dedicated, low, _ = price_row(GPU_SIZE, "westeurope")
    rate = gpu_rate(low, dedicated)
    stretches = [seconds("09:09", "09:55"), seconds("10:05", "11:20"), seconds("11:40", "12:51")]
    lost = seconds("09:36:40", "09:55") + seconds("10:59:10", "11:20")  # after the last checkpoint of each
    startup = 3 * 95.5  # three starts
    assert code == 0
    assert book["requeues"] == 2 and book["starts"] == 3
    assert book["phases"]["queue"]["seconds"] == (
        seconds("09:00", "09:00:05") + seconds("09:01", "09:09") + seconds("09:55", "10:05")
        + seconds("11:20", "11:21") + seconds("11:22", "11:40")
    )  # fmt: skip
    assert book["phases"]["preparation"]["seconds"] == seconds("09:00:05", "09:01") + seconds("11:21", "11:22")
    assert book["phases"]["lost_to_preemption"]["seconds"] == pytest.approx(lost)
    assert book["phases"]["lost_to_preemption"]["usd"] == pytest.approx(lost * rate)
    assert book["phases"]["startup"]["seconds"] == pytest.approx(startup)
    assert book["phases"]["training"]["seconds"] == pytest.approx(sum(stretches) - startup - lost)
    assert book["total"]["usd"] == pytest.approx(sum(stretches) * rate)
    assert [s["last_checkpoint"] for s in book["stretches"]] == [iso(at("09:36:40"))[:19] + "+00:00",
                                                                  iso(at("10:59:10"))[:19] + "+00:00", None]  # fmt: skip
    assert book["per"]["usd_per_epoch"] == pytest.approx(sum(stretches) * rate / 5)
    assert "after the last checkpoint" in book["phases"]["lost_to_preemption"]["note"]
    line = next(x for x in out.splitlines() if x.startswith("lost to preemption"))
    assert f"${lost * rate:,.2f}" in line and "2 requeue(s)" in line


def test_without_checkpoint_times_a_requeue_loses_the_whole_stretch(workspace, dev_outputs, tmp_path, capsys):
    record_preempted(workspace)
    host = f"{workspace.logs['account']}.blob.core.windows.net"
    workspace.fake.on(
        "GET",
        re.escape(f"{host}/{workspace.logs['container']}"),
        fake_arm.storage_error(403, "AuthorizationPermissionMismatch", "This request is not authorized."),
    )
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--status-log", LOG_WS)
    lost = seconds("09:09", "09:55") - 95.5 + seconds("10:05", "11:20") - 95.5  # each stretch after its start-up
    assert code == 0
    assert book["phases"]["lost_to_preemption"]["seconds"] == pytest.approx(lost)
    assert "no checkpoint times" in book["phases"]["lost_to_preemption"]["note"]
    assert any("403 AuthorizationPermissionMismatch" in n and "checkpoint times unknown" in n for n in book["notes"])


def test_without_the_status_log_the_requeues_are_counted_not_placed(workspace, older_outputs, tmp_path, capsys):
    record_preempted(workspace)
    code, out, book, _ = ledger_of(older_outputs, tmp_path, capsys)
    held = seconds("09:09", "09:55") + seconds("10:05", "11:20") + seconds("11:40", "12:51")
    assert code == 0
    assert book["requeues"] == 2  # currentAttemptId 3
    assert book["phases"]["lost_to_preemption"]["seconds"] is None
    before_last = held - seconds("11:40", "12:51")  # the held time before lastStartTimeUtc
    assert f"at most {clock(before_last)}" in book["phases"]["lost_to_preemption"]["note"]
    assert book["phases"]["queue"]["seconds"] == pytest.approx(seconds("09:00", "12:51") - held - 0.123456)
    assert book["total"]["held_seconds"] == held


# ---- a running job ------------------------------------------------------------------------------------------------


def test_a_running_job_projects_the_cost_to_finish(workspace, dev_outputs, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(history, "utcnow", lambda: at("10:15"))
    workspace.job(NAME, "Running", at("09:00"))
    workspace.run(NAME, "Running", at("09:00"), at("09:09"), effectiveStartTimeUtc=iso(at("09:09")))
    workspace.status_log(NAME, [("09:00:00", "NotStarted"), ("09:01:00", "Queued"), ("09:09:00", "Running")])
    workspace.outputs_folder(
        NAME, metrics_json([(1, 1500.0), (2, 1520.0)], 10), [(1, "09:35", True), (2, "10:01", True)]
    )
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--status-log", LOG_WS)
    _, dedicated, low, _ = price_row(GPU_SIZE, "westeurope")
    rate = gpu_rate(low, dedicated)
    so_far = seconds("09:09", "10:15")
    mean = (1500.0 + 1520.0) / 2
    left = 8 * mean - seconds("10:01", "10:15")  # 8 of 10 epochs left, the third under way since 10:01
    assert code == 0
    assert book["total"]["usd"] == pytest.approx(so_far * rate)
    assert book["phases"]["startup"]["seconds"] == 0 and "not known" in book["phases"]["startup"]["note"]
    assert book["projection"]["epochs_left"] == 8
    assert book["projection"]["usd_more"] == pytest.approx(left * rate)
    assert book["projection"]["usd_total"] == pytest.approx((so_far + left) * rate)
    assert book["idle_before_scale_down"] is None
    assert f"projected total ${(so_far + left) * rate:,.2f}" in out


# ---- a failed job -------------------------------------------------------------------------------------------------


def test_a_failed_job_is_priced_and_says_what_a_resume_redoes(workspace, dev_outputs, tmp_path, capsys):
    workspace.job(NAME, "Failed", at("09:00"))
    workspace.run(
        NAME,
        "Failed",
        at("09:00"),
        at("09:09"),
        at("09:50"),
        held=seconds("09:09", "09:50"),
        error={"error": {"code": "UserError", "message": "Execution failed. User process 'python' exited with status code 1."}},
    )  # fmt: skip
    workspace.status_log(
        NAME, [("09:00", "NotStarted"), ("09:01", "Queued"), ("09:09", "Running"), ("09:50", "Failed")]
    )
    workspace.outputs_folder(NAME, metrics_json([(1, 1600.0)], 3), [(1, "09:36:40", True)])
    code, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--status-log", LOG_WS)
    _, dedicated, low, _ = price_row(GPU_SIZE, "westeurope")
    rate = gpu_rate(low, dedicated)
    assert code == 0 and book["status"] == "Failed"
    assert book["total"]["usd"] == pytest.approx(seconds("09:09", "09:50") * rate)
    assert book["since_last_checkpoint"]["seconds"] == seconds("09:36:40", "09:50")
    assert book["phases"]["lost_to_preemption"]["seconds"] == 0  # a failure is not a requeue
    assert book["idle_before_scale_down"]["seconds"] == 600
    assert "a --resume-from job redoes it" in out


# ---- bad input ----------------------------------------------------------------------------------------------------


def test_an_unknown_job_is_named_with_the_fix(workspace, dev_outputs, tmp_path, capsys):
    code, out, book, err = ledger_of(dev_outputs, tmp_path, capsys, name="nosuch_job_123")
    ws = workspace.outputs["workspace_name"]
    assert code == 2 and book is None
    assert err.strip() == (
        f"error: workspace {ws} has no job nosuch_job_123: check the name (`az ml job list -g "
        f"{workspace.outputs['resource_group']} -w {ws} --query [].name -o tsv`) and that the stack outputs are "
        "this workspace's"
    )


@pytest.mark.parametrize("bad", ["../etc", "a job", 'x" or RunId != "'])
def test_a_name_that_is_no_job_name_is_refused_before_any_request(workspace, dev_outputs, tmp_path, capsys, bad):
    code, _, _, err = ledger_of(dev_outputs, tmp_path, capsys, name=bad)
    assert code == 2 and "is not an Azure ML job name" in err
    assert workspace.fake.requests == []


def test_a_size_without_a_price_names_the_fix(workspace, dev_outputs, tmp_path, capsys):
    workspace.job(NAME, "Completed", at("09:00"))
    workspace.run(NAME, "Completed", at("09:00"), at("09:09"), at("10:40"), held=seconds("09:09", "10:40"))
    workspace.fake.on(
        "GET",
        re.escape(f"westeurope.api.azureml.ms/history/v1.0{workspace.ws_id}/runs/{NAME}/details"),
        (200, {"runId": NAME, "status": "Completed", "createdTimeUtc": iso(at("09:00")), "startTimeUtc":
               iso(at("09:09")), "endTimeUtc": iso(at("10:40")), "computeDuration": timespan(5460),
               "compute": {"vmSize": "Standard_NC48ads_A100_v4", "instanceCount": 2, "priority": "Dedicated"}}, {}),
    )  # fmt: skip
    code, _, book, err = ledger_of(dev_outputs, tmp_path, capsys)
    assert code == 2 and book is None
    assert "no price for Standard_NC48ads_A100_v4 in launcher/vm_prices.csv (any region)" in err
    assert "`python -m launcher.prices --refresh westeurope`" in err and "--price-per-node-hour USD" in err
    code, _, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--price-per-node-hour", "7.35")
    assert code == 0 and book["total"]["usd"] == pytest.approx(5460 * 2 * 7.35 / 3600)


# ---- item 7: the planner beside the ledger ------------------------------------------------------------------------


def test_the_planner_estimate_stands_beside_the_ledger(workspace, dev_outputs, tmp_path, capsys):
    from trainingplatform import scaling, vm_sizes

    record_plain(workspace)
    code, out, book, _ = ledger_of(
        dev_outputs, tmp_path, capsys, "--status-log", LOG_WS, "--gpu-images-per-sec", "2470"
    )
    _, dedicated, low, _ = price_row(GPU_SIZE, "westeurope")
    rate = gpu_rate(low, dedicated)
    # the scaling model (what the planner prints), for what metrics.json records: 16 processes, 8 a node, batch 256, ResNet-50's gradients
    size = vm_sizes.lookup(GPU_SIZE)
    eff = scaling.efficiency(16, 8, 256, 2470.0, 102.228128e6, scaling.nccl_transport(size), False)
    predicted = eff * 16 * 2470.0
    images = 3 * EPOCH_IMAGES
    measured = images / sum(s for _, s in PLAIN_EPOCHS)
    training = seconds("09:09", "10:40") - 95.5
    plan = book["planner"]
    assert code == 0
    assert plan["predicted_images_per_sec"] == pytest.approx(predicted)
    assert plan["speed_ratio"] == pytest.approx(measured / predicted)
    assert plan["planned_usd"] == pytest.approx(images / predicted * rate)
    assert plan["cost_ratio"] == pytest.approx(training / (images / predicted))
    assert f"({training / (images / predicted):.2f}x)" in out
    # without the one-GPU rate the planner has no input, and says where to get it
    _, out, book, _ = ledger_of(dev_outputs, tmp_path, capsys, "--status-log", LOG_WS)
    assert "--gpu-images-per-sec" in book["planner"]["note"] and "planner: " in out


# ---- the price table: dated rows, any capitalisation --------------------------------------------------------------


def test_a_refreshed_region_is_dated_and_sizes_match_in_any_case(tmp_path):
    table = tmp_path / "prices.csv"
    table.write_text("# Test prices.\nregion,vm_size,dedicated,low_priority\neastus,Standard_ND96asr_v4,27.197,5.439\n")

    def fetch(region, size):
        return [{"productName": "NDasrA100_v4", "skuName": "ND96asr v4", "retailPrice": 30.0, "type": "Consumption"}]

    table.write_text(prices.refresh("westeurope", table, fetch, today=dt.date(2026, 12, 1)))
    found, _ = prices.quote("STANDARD_ND96ASR_V4", False, "westeurope", table)
    assert found.vm_size == "Standard_ND96asr_v4" and found.per_node_hour == 30.0
    assert found.region == "westeurope" and found.date == "2026-12-01"
    found, _ = prices.quote("standard_nd96asr_v4", True, "westeurope", table)  # no low-priority price there
    assert found.kind == "dedicated" and found.no_low_priority_price


def test_outputs_dev_has_what_the_ledger_reads(dev_outputs):
    """The ledger finds metrics.json through the logs datastore's account and container in the stack outputs."""
    outs = stack.load_file(dev_outputs)
    assert {"account", "container", "name"} <= set(outs["datastores"]["logs"])
