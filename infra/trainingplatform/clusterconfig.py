"""The compute clusters' settings (config `clusters`, `imageBuildCluster`): read and validated for compute.py,
which declares them, against the VM-size catalog. config.load calls read_clusters and image_build_cluster."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from . import vm_sizes
from .reader import Reader


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    vm_size: str
    min_nodes: int
    max_nodes: int
    low_priority: bool
    idle_seconds_before_scale_down: int
    ssh_enabled: bool

    @property
    def size(self) -> vm_sizes.VmSize:
        return vm_sizes.CATALOG[self.vm_size]


_CLUSTER = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{1,14}[a-zA-Z0-9]$")  # AML: 3-16 chars


CLUSTER_KEYS = ("name", "vmSize", "minNodes", "maxNodes", "priority", "idleSecondsBeforeScaleDown", "sshEnabled")


def read_clusters(r: Reader, raw: dict, today: dt.date) -> tuple[Cluster, ...]:
    items = r.get(raw, "clusters", "", list, allowed="a list of {name, vmSize, minNodes, maxNodes, ...}")
    if items is None:
        return ()
    if not items:
        r.bad("clusters", items, "declare at least one cluster")
    out, seen = [], set()
    for p, c in r.mappings(items, "clusters", "expected a mapping with name, vmSize, minNodes, maxNodes", CLUSTER_KEYS):
        name = r.get(c, "name", p, str)
        if name is not None:
            if not _CLUSTER.match(name):
                r.bad(p + "name", name, "3-16 letters, digits and hyphens, starting with a letter (Azure ML's rule)")
            if name in seen:
                r.bad(p + "name", name, "cluster names must be unique")
            seen.add(name)
        size_name = r.get(c, "vmSize", p, str)
        size = vm_sizes.lookup(size_name) if size_name else None
        if size_name and size is None:
            r.bad(
                p + "vmSize",
                size_name,
                "not in the VM-size catalog (infra/trainingplatform/vm_sizes.py); "
                f"available: {', '.join(vm_sizes.available(today))}",
            )
        elif size and size.retired and size.retired <= today:
            r.bad(
                p + "vmSize",
                size_name,
                f"retired by Azure on {size.retired.isoformat()}; "
                f"use a current size instead: {', '.join(size.successors)}",
            )
        lo = r.get(c, "minNodes", p, int, 0)
        hi = r.get(c, "maxNodes", p, int)
        if lo is not None and lo < 0:
            r.bad(p + "minNodes", lo, "0 or more (0 lets the cluster scale to zero)")
        if hi is not None and hi < 1:
            r.bad(p + "maxNodes", hi, "1 or more")
        if lo is not None and hi is not None and hi < lo:
            r.bad(p + "maxNodes", hi, f"must be at least minNodes ({lo})")
        priority = r.choice(c, "priority", p, "Dedicated", ("Dedicated", "LowPriority"), "Dedicated or LowPriority")
        idle = r.within(c, "idleSecondsBeforeScaleDown", p, 600, 60, 86400, "60 to 86400 seconds")
        ssh = r.get(c, "sshEnabled", p, bool, False)
        if None not in (name, size, hi, lo, idle) and not (size.retired and size.retired <= today):
            out.append(
                Cluster(
                    name=name,
                    vm_size=size.name,
                    min_nodes=lo,
                    max_nodes=hi,
                    low_priority=priority == "LowPriority",
                    idle_seconds_before_scale_down=idle,
                    ssh_enabled=ssh,
                )
            )
    return tuple(out)


def image_build_cluster(r: Reader, raw: dict, clusters: tuple[Cluster, ...]) -> str | None:
    """The cluster Azure ML builds images on. Azure ML builds on a CPU cluster only ("Only a CPU SKU is
    supported": https://learn.microsoft.com/azure/machine-learning/how-to-secure-workspace-vnet, "Enable Azure
    Container Registry (ACR)"); a GPU cluster here would fail the first image build, after deployment."""
    build = r.get(raw, "imageBuildCluster", "", str, None)
    cpu = [c.name for c in clusters if c.size.gpus == 0]
    if build is not None and clusters:
        chosen = next((c for c in clusters if c.name == build), None)
        if chosen is None:
            r.bad("imageBuildCluster", build, f"not a declared cluster; one of {', '.join(c.name for c in clusters)}")
        elif chosen.size.gpus:
            r.bad(
                "imageBuildCluster",
                build,
                f"is a GPU cluster ({chosen.vm_size}); Azure ML builds images on CPU "
                f"compute only: name a CPU cluster ({', '.join(cpu) if cpu else 'declare one, e.g. Standard_D4s_v5'})",
            )
    if build is None and clusters:
        if not cpu:
            r.bad(
                "clusters",
                [c.name for c in clusters],
                "no CPU cluster to build images on (Azure ML builds images "
                "on CPU compute only): add one, e.g. {name: cpu-build, vmSize: Standard_D4s_v5, maxNodes: 1}",
            )
        build = cpu[0] if cpu else None
    return build
