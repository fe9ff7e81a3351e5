"""The cluster a submission runs on, resolved once at its start (resolve) and handed down: the job's filling, its
sizing, the decoded cache, the dry run's cost, the health check and the supervisor read this record, and none of them
looks the cluster or its VM size up again."""

from __future__ import annotations

import dataclasses
import datetime as dt

from azureaccess.errors import JobError
from azureaccess.stack import StackOutputs
from trainingplatform import vm_sizes  # the catalog the stack itself validates against


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # the key of the stack output `clusters`
    cluster: dict  # that entry: vm_size, gpus_per_node, vcpus_per_node, infiniband, max_nodes, compute_name, ...
    size: vm_sizes.VmSize | None  # the VM-size catalog's entry (None: a size it does not hold)
    nodes: int
    processes_per_node: int

    @property
    def vm_size(self) -> str:
        return self.cluster["vm_size"]

    @property
    def compute(self) -> str:
        """The Azure ML name (it carries a hash of the VM size: infra/trainingplatform/naming.py); older stacks named
        the cluster as the config did."""
        return self.cluster.get("compute_name") or self.name


def resolve(outputs: StackOutputs, name: str | None, nodes: int, processes_per_node: int | None) -> Target:
    """Cluster `name` of the stack with `nodes` nodes and `processes_per_node` (None: one per GPU, 1 on CPU sizes),
    refused with the fix where the cluster cannot hold them."""
    cluster = outputs.cluster(name)
    size = vm_sizes.lookup(cluster["vm_size"])
    if size is not None and size.retired is not None and size.retired <= dt.date.today():
        # a stack outputs file older than a size's retirement still names it
        raise JobError(
            f"cluster {name} is a {cluster['vm_size']}, which Azure retired on {size.retired}: no job can "
            f"run there; move the cluster to {' or '.join(size.successors)} in Pulumi.<stack>.yaml, "
            "run pulumi up and write the stack outputs again"
        )
    if nodes < 1:
        raise JobError(
            f"--nodes {nodes}: a job needs at least 1 node (leave --nodes out for the job file's instance_count)"
        )
    if nodes > cluster["max_nodes"]:
        raise JobError(
            f"--nodes {nodes}: cluster {name} scales to {cluster['max_nodes']} nodes (raise maxNodes in the stack config)"
        )
    if processes_per_node is not None and processes_per_node < 1:
        raise JobError(
            f"--processes-per-node {processes_per_node}: at least 1 process per node (leave it out "
            "for one per GPU, or 1 on CPU clusters)"
        )
    gpus = cluster["gpus_per_node"]
    ppn = processes_per_node or gpus or 1
    if gpus and ppn > gpus:
        raise JobError(
            f"--processes-per-node {ppn} is more than the {gpus} GPUs of a {cluster['vm_size']} node: "
            "one process per GPU at most"
        )
    if not gpus and ppn > cluster.get("vcpus_per_node", ppn):
        raise JobError(
            f"--processes-per-node {ppn} is more than the {cluster['vcpus_per_node']} vCPUs of a "
            f"{cluster['vm_size']} node"
        )
    return Target(name, cluster, size, nodes, ppn)
