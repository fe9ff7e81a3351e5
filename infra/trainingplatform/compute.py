"""GPU (and CPU smoke-test) compute clusters from config, all sharing one user-assigned identity.

Nodes sit in the compute subnet with no public IP; clusters scale to `minNodes` (0 by default) after
`idleSecondsBeforeScaleDown`. Nodes without a public IP have no public SSH port: `sshEnabled` puts the
admin user's key on the nodes, and SSH works from inside the VNet (a jump host, Bastion or VPN) to a
node's private IP (`az ml compute list-nodes`), which the NSG's default AllowVnetInBound rule admits.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
from pulumi_azure_native import machinelearningservices as ml
from pulumi_azure_native import managedidentity

from . import naming
from .clusterconfig import Cluster

# What Azure ML cannot change on an existing cluster. Its update call carries scale settings only
# (REST "Compute - Update": ClusterUpdateParameters.properties.properties.scaleSettings; `az ml compute
# update` and Update-AzMLWorkspaceCompute offer min/max nodes and idle time), so a PUT with a new VM size,
# priority, subnet or node public IP is answered with success and the cluster keeps the old one; likewise
# SSH access ("SSH access can't be changed after creation", how-to-create-attach-compute-cluster). Replacing
# is the only way, and under a new name (naming.cluster hashes these, and sshEnabled, into it): the new
# cluster is created beside the old one, which is deleted after. With the same name, delete-then-create
# raced Azure ML's asynchronous delete and could leave the old size in place. The identity is not here: Azure ML updates a
# cluster's identity in place (`az ml compute update --identity-type/--user-assigned-identities`), so an
# identity change must not delete the cluster and the jobs running on it.
REPLACE_ON_CHANGES = (
    "computeName",
    "properties.properties.vmSize",
    "properties.properties.vmPriority",
    "properties.properties.subnet",
    "properties.properties.enableNodePublicIp",
)


def priority(c: Cluster) -> str:
    return "LowPriority" if c.low_priority else "Dedicated"


def compute_name(c: Cluster, subnet_id, workspace_name) -> pulumi.Output[str] | str:
    """The Azure ML name of cluster `c` in the workspace named `workspace_name`: what jobs and the workspace's
    imageBuildCompute name. The one place it is made, so that the two can never differ."""
    return naming.cluster(
        c.name, c.vm_size, priority(c), subnet_id, ssh_enabled=c.ssh_enabled, workspace_name=workspace_name
    )


def compute_identity(
    name: str, resource_group, location: str, tags: dict, opts: pulumi.ResourceOptions | None = None
) -> managedidentity.UserAssignedIdentity:
    """The clusters' one identity, declared on its own so its role grants can exist before any cluster."""
    return managedidentity.UserAssignedIdentity(
        f"{name}-identity", resource_group_name=resource_group, location=location, tags=tags, opts=opts
    )


class ComputeClusters(pulumi.ComponentResource):
    """Outputs: identity (principal and client ids), clusters {name: {vm_size, gpus_per_node, infiniband, ...}}.

    depends_on: what a cluster needs before Azure ML provisions it: the workspace private endpoint with its
    DNS (no-public-IP nodes reach the workspace only through it) and the identity's AcrPull grant (the
    first job pulls its image with it).
    """

    def __init__(
        self,
        name: str,
        *,
        resource_group,
        location: str,
        workspace_name,
        subnet_id,
        clusters: tuple[Cluster, ...],
        tags: dict,
        identity: managedidentity.UserAssignedIdentity,
        ssh_public_key: pulumi.Input[str] | None = None,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:compute:ComputeClusters", name, None, opts)
        self.identity = identity
        self.clusters: dict[str, ml.Compute] = {}
        for c in clusters:
            ssh = None
            if c.ssh_enabled:
                if ssh_public_key is None:
                    raise ValueError(
                        f"cluster {c.name} has sshEnabled but no sshPublicKey secret is set: "
                        "pulumi config set --secret sshPublicKey \"$(cat ~/.ssh/id_rsa.pub)\""
                    )
                ssh = ml.UserAccountCredentialsArgs(
                    admin_user_name="azureuser", admin_user_ssh_public_key=ssh_public_key
                )
            self.clusters[c.name] = ml.Compute(
                f"{name}-{c.name}",
                compute_name=compute_name(c, subnet_id, workspace_name),
                resource_group_name=resource_group,
                workspace_name=workspace_name,
                location=location,
                identity=ml.ManagedServiceIdentityArgs(type="UserAssigned", user_assigned_identities=[identity.id]),
                properties=ml.AmlComputeArgs(
                    compute_type="AmlCompute",
                    disable_local_auth=True,
                    description=summary(c.size),
                    properties=ml.AmlComputePropertiesArgs(
                        vm_size=c.vm_size,
                        vm_priority=priority(c),
                        os_type="Linux",
                        enable_node_public_ip=False,
                        isolated_network=False,
                        # Nodes have no public IP, so there is no public SSH port to open; with sshEnabled
                        # the key below admits SSH from inside the VNet.
                        remote_login_port_public_access="Disabled",
                        user_account_credentials=ssh,
                        subnet=ml.ResourceIdArgs(id=subnet_id),
                        scale_settings=ml.ScaleSettingsArgs(
                            min_node_count=c.min_nodes,
                            max_node_count=c.max_nodes,
                            node_idle_time_before_scale_down=f"PT{c.idle_seconds_before_scale_down}S",
                        ),
                    ),
                ),
                tags=tags,
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=list(depends_on), replace_on_changes=list(REPLACE_ON_CHANGES)
                ),
            )
        self.register_outputs({"identity": identity.principal_id})


def describe(c: Cluster, compute_name: pulumi.Input[str]) -> dict:
    """What job submission needs to know about a cluster (it becomes a stack output). `compute_name` is the
    cluster's Azure ML name, which jobs are submitted to; `name` is the config's (the launcher's --cluster)."""
    s = c.size
    return {
        "name": c.name,
        "compute_name": compute_name,
        "vm_size": c.vm_size,
        "gpus_per_node": s.gpus,
        "gpu_model": s.gpu_model,
        "infiniband": bool(s.infiniband),
        "infiniband_generation": s.infiniband,
        "intra_node": s.intra_node,
        "min_nodes": c.min_nodes,
        "max_nodes": c.max_nodes,
        "low_priority": c.low_priority,
        "vcpus_per_node": s.vcpus,
    }


def summary(size) -> str:
    """A cluster's one-line description: its GPUs and interconnect, or its vCPUs for a CPU size."""
    what = f"{size.gpus}x {size.gpu_model}" if size.gpus else f"{size.vcpus} vCPUs, no GPU"
    return what + (f", InfiniBand {size.infiniband}" if size.infiniband else "")
