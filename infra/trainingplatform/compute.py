"""GPU (and CPU smoke-test) compute clusters from config, all sharing one user-assigned identity.

Nodes sit in the compute subnet with no public IP and SSH off unless a cluster asks for it; clusters
scale to `minNodes` (0 by default) after `idleSecondsBeforeScaleDown`.
"""
from __future__ import annotations

import pulumi
from pulumi_azure_native import machinelearningservices as ml, managedidentity

from .config import Cluster


class ComputeClusters(pulumi.ComponentResource):
    """Outputs: identity (principal and client ids), clusters {name: {vm_size, gpus_per_node, infiniband, ...}}."""

    def __init__(self, name: str, resource_group, location: str, workspace_name, subnet_id,
                 clusters: tuple[Cluster, ...], tags: dict, ssh_public_key: pulumi.Input[str] | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainingplatform:compute:ComputeClusters", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.identity = managedidentity.UserAssignedIdentity(f"{name}-identity", resource_group_name=resource_group,
                                                             location=location, tags=tags, opts=child)
        self.clusters: dict[str, ml.Compute] = {}
        for c in clusters:
            ssh = None
            if c.ssh_enabled:
                if ssh_public_key is None:
                    raise ValueError(f"cluster {c.name} has sshEnabled but no sshPublicKey secret is set: "
                                     "pulumi config set --secret sshPublicKey \"$(cat ~/.ssh/id_rsa.pub)\"")
                ssh = ml.UserAccountCredentialsArgs(admin_user_name="azureuser", admin_user_ssh_public_key=ssh_public_key)
            self.clusters[c.name] = ml.Compute(
                f"{name}-{c.name}", compute_name=c.name, resource_group_name=resource_group, workspace_name=workspace_name,
                location=location,
                identity=ml.ManagedServiceIdentityArgs(type="UserAssigned", user_assigned_identities=[self.identity.id]),
                properties=ml.AmlComputeArgs(
                    compute_type="AmlCompute", disable_local_auth=True,
                    description=f"{c.size.gpus}x {c.size.gpu_model or 'CPU'}"
                                f"{', InfiniBand ' + c.size.infiniband if c.size.infiniband else ''}",
                    properties=ml.AmlComputePropertiesArgs(
                        vm_size=c.vm_size, vm_priority="LowPriority" if c.low_priority else "Dedicated",
                        os_type="Linux", enable_node_public_ip=False, isolated_network=False,
                        remote_login_port_public_access="Enabled" if c.ssh_enabled else "Disabled",
                        user_account_credentials=ssh,
                        subnet=ml.ResourceIdArgs(id=subnet_id),
                        scale_settings=ml.ScaleSettingsArgs(
                            min_node_count=c.min_nodes, max_node_count=c.max_nodes,
                            node_idle_time_before_scale_down=f"PT{c.idle_seconds_before_scale_down}S"))),
                tags=tags, opts=child)
        self.register_outputs({"identity": self.identity.principal_id})


def describe(c: Cluster) -> dict:
    """What job submission needs to know about a cluster (a plain dict: it becomes a stack output)."""
    s = c.size
    return {"name": c.name, "vm_size": c.vm_size, "gpus_per_node": s.gpus, "gpu_model": s.gpu_model,
            "infiniband": bool(s.infiniband), "infiniband_generation": s.infiniband, "intra_node": s.intra_node,
            "min_nodes": c.min_nodes, "max_nodes": c.max_nodes, "low_priority": c.low_priority,
            "vcpus_per_node": s.vcpus}
