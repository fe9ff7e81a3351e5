"""Azure ML compute quota per cluster: does one node fit, do maxNodes fit.

Azure ML's quota is its own, apart from the VMs' (learn.microsoft.com/azure/machine-learning/how-to-manage-quotas,
"Azure Machine Learning Compute"): dedicated vCPUs per VM family and region, capped again by a regional
dedicated total; low-priority vCPUs are ONE regional number across families ("This limit is a single value
across VM families"). GPU families start at zero.

One node that does not fit fails: Azure refuses to create the cluster even with minNodes 0 (error code
ClusterMinNodesExceedCoreQuota, "The specified subscription has a Standard DSv2 family vCPU quota of 6 and
cannot accomodate for at least 1 requested managed compute nodes which maps to 8 vCPUs", reported for a
cluster with min_instances 0 in github.com/ansible-collections/azure/pull/2209). maxNodes above the quota
only warns: the cluster exists, and jobs that need more nodes than the quota admits wait in the queue.

A workspace may have a lower quota of its own per family (how-to-manage-quotas, "Workspace-level quotas";
Quotas - List): once the workspace exists, that caps its dedicated clusters too.

Rows are read from Usages - List, Quotas - List and Virtual Machine Sizes - List (REST, api-version
2024-04-01; the documented response shapes are in tests/azurecheck/test_preflight.py and test_doctor.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .arm import ML_API, Arm
from .findings import FAIL, OK, WARN, Finding

REQUEST_URL = "https://ml.azure.com/quota"  # the studio's quota page (how-to-manage-quotas: "filing a support ticket")
HOW_TO = "https://learn.microsoft.com/azure/machine-learning/how-to-manage-quotas#request-quota-and-limit-increases"


@dataclass(frozen=True)
class Need:
    """What one cluster asks of the quota."""

    cluster: str
    vm_size: str
    max_nodes: int
    low_priority: bool


@dataclass(frozen=True)
class Pool:
    label: str  # as the portal and the studio name it
    limit: int  # < 0: no limit at this level
    used: int


@dataclass
class Region:
    location: str
    sizes: dict[str, dict] = field(default_factory=dict)  # lowercased size name -> vmSizes item
    families: dict[str, Pool] = field(default_factory=dict)  # family key -> dedicated pool
    dedicated_total: Pool | None = None
    low_priority: Pool | None = None
    workspace: dict[str, Pool] = field(default_factory=dict)  # family key -> the workspace's own dedicated quota
    usage_rows: list[dict] = field(default_factory=list)


def family_key(text: str) -> str | None:
    """'standardNDASv4_A100Family', 'Standard NDASv4_A100 Family Cluster Dedicated vCPUs' and
    'Standard_NDASv4_A100_Family_Cluster_Dedicated_vCPUs' all -> 'ndasv4a100'."""
    m = re.match(r"standard(.+?)family", re.sub(r"[^a-z0-9]", "", text.lower()))
    return m.group(1) if m else None


def read_region(arm: Arm, subscription: str, location: str) -> Region:
    base = f"/subscriptions/{subscription}/providers/Microsoft.MachineLearningServices/locations/{location}"
    region = Region(location)
    for size in arm.list(f"{base}/vmSizes", ML_API):
        region.sizes[str(size.get("name", "")).lower()] = size
    for row in arm.list(f"{base}/usages", ML_API):
        region.usage_rows.append(row)
        rtype = str(row.get("type", "")).lower()
        name = row.get("name") or {}
        label = name.get("localizedValue") or name.get("value") or ""
        pool = Pool(label, int(row.get("limit", 0)), int(row.get("currentValue", 0)))
        text = " ".join((label, str(name.get("value", "")), str(row.get("id", "")))).lower().replace("_", " ")
        if rtype.endswith("/lowprioritycores/usages"):
            region.low_priority = pool
        elif rtype.endswith("/dedicatedcores/usages"):
            region.dedicated_total = pool
        elif rtype.endswith("/vmfamily/usages") and "lowpriority" not in text.replace(" ", ""):
            # subscription-level rows only: workspace and compute rows (workspaces/usages...) repeat them
            key = family_key(label) or family_key(str(row.get("id", "")).rsplit("/", 1)[-1])
            if key:
                region.families[key] = pool
    return region


def read_workspace_quotas(arm: Arm, region: Region, subscription: str, workspace_id: str) -> None:
    """Add the workspace's own per-family limits (rows of type workspaces/quotas under its id; a negative
    limit: none set, the subscription's applies)."""
    base = f"/subscriptions/{subscription}/providers/Microsoft.MachineLearningServices/locations/{region.location}"
    prefix = workspace_id.lower().rstrip("/") + "/"
    used = {
        family_key(str(r.get("id", "")).rsplit("/", 1)[-1]): int(r.get("currentValue", 0))
        for r in region.usage_rows
        if str(r.get("type", "")).lower().endswith("/workspaces/usages")
        and str(r.get("id", "")).lower().startswith(prefix)
    }
    name = workspace_id.rstrip("/").rsplit("/", 1)[-1]
    for row in arm.list(f"{base}/quotas", ML_API):
        if not (
            str(row.get("type", "")).lower().endswith("/workspaces/quotas")
            and str(row.get("id", "")).lower().startswith(prefix)
        ):
            continue
        label = (row.get("name") or {}).get("localizedValue") or (row.get("name") or {}).get("value") or ""
        key, limit = family_key(label), int(row.get("limit", -1))
        if key and limit >= 0 and "lowpriority" not in label.lower().replace(" ", ""):
            region.workspace[key] = Pool(f"{label} (workspace {name})", limit, used.get(key, 0))


def _request(cluster_need: Need, vcpus: int, label: str, location: str) -> str:
    return (
        f"request {cluster_need.max_nodes * vcpus} vCPUs of '{label}' in {location}: {REQUEST_URL} "
        f"(Quota, then the subscription and region; steps: {HOW_TO})"
    )


def check(region: Region, need: Need, nodes: int | None = None) -> list[Finding]:
    """Findings for one cluster; `nodes`: a job's node count (submission), checked against what can run."""
    name = f"quota {need.cluster}"
    size = region.sizes.get(need.vm_size.lower())
    types = [t.lower() for t in (size or {}).get("supportedComputeTypes") or ["amlcompute"]]
    if size is None or "amlcompute" not in types:
        return [
            Finding(
                FAIL,
                name,
                f"{need.vm_size} is not offered for Azure ML compute clusters in {region.location}",
                f"pick a size that is: `az ml compute list-sizes --location {region.location} --type "
                "AmlCompute -o table`, or another region (azure-native:location)",
            )
        ]
    vcpus, family = int(size.get("vCPUs") or 0), str(size.get("family", "?"))
    if need.low_priority:
        if size.get("lowPriorityCapable") is False:
            return [
                Finding(
                    FAIL,
                    name,
                    f"{need.vm_size} cannot run as LowPriority in {region.location}",
                    "set priority: Dedicated for this cluster in Pulumi.<stack>.yaml",
                )
            ]
        pool, kind = region.low_priority, "low-priority (one regional pool for every family)"
        pools = [pool] if pool else []
    else:
        key = family_key(family) or ""
        pool, kind = region.families.get(key), "dedicated"
        pools = [p for p in (pool, region.workspace.get(key), region.dedicated_total) if p]
    facts = (
        f"VM family {family}, {vcpus} vCPUs per node, {need.max_nodes * vcpus} for maxNodes {need.max_nodes}; "
        f"{kind} quota: "
        + ", ".join(f"'{p.label}' {p.limit if p.limit >= 0 else 'unlimited'} ({p.used} in use)" for p in pools)
    )
    if pool is None:
        return [
            Finding(
                WARN,
                name,
                f"{facts}none: no {kind} quota row for family {family} in {region.location}; not judged",
                f"look it up in the studio: {REQUEST_URL}",
            )
        ]
    limited = [p for p in pools if p.limit >= 0]
    if not limited:
        return [Finding(OK, name, facts)]
    tight = min(limited, key=lambda p: p.limit)
    fix = _request(need, vcpus, tight.label, region.location)
    if vcpus > tight.limit:
        return [
            Finding(
                FAIL,
                name,
                f"{facts}. One node ({vcpus} vCPUs) exceeds '{tight.label}' ({tight.limit}): "
                "Azure refuses to create the cluster (ClusterMinNodesExceedCoreQuota), even with minNodes 0",
                fix,
            )
        ]
    findings = []
    if need.max_nodes * vcpus > tight.limit:
        findings.append(
            Finding(
                WARN,
                name,
                f"{facts}. maxNodes {need.max_nodes} needs {need.max_nodes * vcpus} "
                f"vCPUs, above '{tight.label}' ({tight.limit}): at most {tight.limit // vcpus} nodes "
                "run at once; a job needing more waits in the queue for good",
                fix + ", or lower maxNodes",
            )
        )
    if nodes is not None:
        free = min(p.limit - p.used for p in limited)
        if nodes * vcpus > tight.limit:
            return [
                Finding(
                    FAIL,
                    name,
                    f"{facts}. The job needs {nodes} nodes = {nodes * vcpus} vCPUs, above "
                    f"'{tight.label}' ({tight.limit}): it would wait in the queue for good",
                    _request(
                        Need(need.cluster, need.vm_size, nodes, need.low_priority), vcpus, tight.label, region.location
                    )
                    + f", or run on {tight.limit // vcpus} nodes (--nodes)",
                )
            ]
        if nodes * vcpus > free:
            findings.append(
                Finding(
                    WARN,
                    name,
                    f"{facts}. The job needs {nodes * vcpus} vCPUs; {max(free, 0)} are free "
                    "now: it waits until other work releases nodes",
                )
            )
    return findings or [Finding(OK, name, facts)]


def check_totals(region: Region, needs: list[Need]) -> list[Finding]:
    """Clusters drawing on the same pool: together at maxNodes, above it? (each alone may fit)."""
    groups: dict[str, tuple[Pool, list[Need], int]] = {}
    for need in needs:
        size = region.sizes.get(need.vm_size.lower())
        if not size:
            continue
        pool = (
            region.low_priority if need.low_priority else region.families.get(family_key(str(size.get("family"))) or "")
        )
        if pool is None or pool.limit < 0:
            continue
        _, members, total = groups.get(pool.label, (pool, [], 0))
        groups[pool.label] = (pool, members + [need], total + need.max_nodes * int(size.get("vCPUs") or 0))
    return [
        Finding(
            WARN,
            f"quota '{label}'",
            f"clusters {', '.join(n.cluster for n in members)} together need "
            f"{total} vCPUs at maxNodes, above {pool.limit}: they cannot all be at full size at once",
            f"request more at {REQUEST_URL}, or lower their maxNodes",
        )
        for label, (pool, members, total) in groups.items()
        if len(members) > 1 and total > pool.limit
    ]
