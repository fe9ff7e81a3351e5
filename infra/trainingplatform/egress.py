"""Which storage accounts compute may reach: a service endpoint policy on the compute subnet.

`restrictOutbound` (network.py) allows outbound to the `Storage.<region>` service tag, because Azure ML's
clusters need storage (the workspace's, Azure Batch's and Azure ML's own). That tag is every storage
account in the region, anyone's: on its own it lets a job write the data to an account of its author's
choosing. Azure ML names this risk and its remedy
(https://learn.microsoft.com/azure/machine-learning/how-to-prevent-data-loss-exfiltration): a service
endpoint policy on the compute subnet that lists the accounts allowed, plus the alias
`/services/Azure/MachineLearning`, which stands for the Microsoft-managed accounts Azure ML and Batch
need. With the subnet's `Microsoft.Storage` service endpoint, storage traffic from the subnet to the region
goes over the service endpoint, and the policy drops requests to any account it does not list
(https://learn.microsoft.com/azure/virtual-network/virtual-network-service-endpoint-policies-overview).

What it does not do: it filters service-endpoint traffic to Azure Storage only. Traffic through private
endpoints (the data, logs, NFS and, in the private profile, workspace accounts) is not subject to it
("Service endpoint policy and private endpoint are independent", same Azure ML page); storage in other
regions is not reached over the service endpoint at all (the NSG allows `Storage.<region>` only); other
Azure services the NSG allows (AzureMonitor, AzureFrontDoor.Frontend, ...) are not storage and not covered.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
from pulumi_azure_native import network

# Azure ML's alias for the Microsoft-managed storage its compute needs (how-to-prevent-data-loss-exfiltration,
# "Create the service endpoint policy": "+ Add an alias ... /services/Azure/MachineLearning").
AML_ALIAS = "/services/Azure/MachineLearning"


def storage_account_id(
    subscription_id: pulumi.Input[str], resource_group: pulumi.Input[str], account_name: pulumi.Input[str]
) -> pulumi.Output[str]:
    """An account's ARM id from its parts: the policy must exist before the subnet, and the workspace
    storage (whose network rule names the subnet) after it, so its id cannot come from the resource."""
    return pulumi.Output.concat(
        "/subscriptions/",
        subscription_id,
        "/resourceGroups/",
        resource_group,
        "/providers/Microsoft.Storage/storageAccounts/",
        account_name,
    )


class StorageEgressPolicy(pulumi.ComponentResource):
    """A service endpoint policy admitting `account_ids` and Azure ML's alias. Attach `policy.id` to the
    compute subnet (network.py: `service_endpoint_policies`)."""

    def __init__(
        self,
        name: str,
        resource_group,
        location: str,
        account_ids: Sequence[pulumi.Input[str]],
        tags: dict,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:egress:StorageEgressPolicy", name, None, opts)
        if not account_ids:
            raise ValueError("a storage egress policy needs at least the workspace storage account")
        self.policy = network.ServiceEndpointPolicy(
            f"{name}-policy",
            resource_group_name=resource_group,
            location=location,
            service_endpoint_policy_definitions=[
                network.ServiceEndpointPolicyDefinitionArgs(
                    name="stack-accounts",
                    service="Microsoft.Storage",
                    service_resources=list(account_ids),
                    description="The stack's own storage accounts",
                ),
                # Aliases go in a definition of their own, with service "Global" (the form the portal writes).
                network.ServiceEndpointPolicyDefinitionArgs(
                    name="azure-machine-learning",
                    service="Global",
                    service_resources=[AML_ALIAS],
                    description="Microsoft-managed storage that Azure ML and Batch need",
                ),
            ],
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"policy_id": self.policy.id})
