"""Submit a validated job to Azure ML with azure-ai-ml, stream its logs, and return its final status."""
from __future__ import annotations

from .stack import StackOutputs

DONE_OK = {"Completed"}


def client(outputs: StackOutputs):
    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential   # az login, a managed identity, or env credentials

    return MLClient(DefaultAzureCredential(), outputs["subscription_id"], outputs["resource_group"],
                    outputs["workspace_name"])


def submit(job, outputs: StackOutputs, stream: bool = True, ml_client=None) -> int:
    ml = ml_client or client(outputs)
    created = ml.jobs.create_or_update(job)
    print(f"submitted {created.name}: {created.studio_url}", flush=True)
    if not stream:
        return 0
    ml.jobs.stream(created.name)      # returns when the job ends
    final = ml.jobs.get(created.name)
    print(f"job {created.name} ended: {final.status}", flush=True)
    return 0 if final.status in DONE_OK else 1
