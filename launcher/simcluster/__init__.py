"""`python -m launcher JOB --target local --nodes N`: the job on N simulated nodes of this machine, started as Azure
ML starts it, with the settings the launcher gives a cluster job (docs/rehearse.md). cluster.py makes the nodes,
node.py is each node's holder, agent.py the `ssh` between them, launch.py starts and stops the job."""

from __future__ import annotations

import os
import pathlib

from azureaccess.errors import JobError

from .. import interconnect, jobspec, local
from . import launch as runner

# Without --cluster the simulated nodes are CPU nodes sharing this machine's cores.
SIMULATED = {"vm_size": "simulated", "gpus_per_node": 0, "infiniband": False, "max_nodes": 8}


def plan(
    template: dict,
    source: pathlib.Path,
    inputs: dict[str, str],
    out_root: pathlib.Path,
    nodes: int,
    processes_per_node: int | None,
    extra: list[str],
    cluster: dict | None = None,
    overrides: dict[str, str] | None = None,
) -> tuple[runner.Plan, dict[str, pathlib.Path], list[str]]:
    """(the job on the simulated cluster, output name -> folder, lines to print first). `cluster`: a `clusters`
    entry of the stack outputs whose settings the nodes get (an InfiniBand size's gives them its cards in sysfs);
    they have no GPU, which the payload is told (TRAINING_GPUS_PER_NODE=0)."""
    if nodes < 1:
        raise JobError(f"--nodes {nodes}: at least 1 simulated node")
    ppn = processes_per_node or 1
    if ppn < 1:
        raise JobError(f"--processes-per-node {ppn}: at least 1 process per node")
    notes = []
    record = dict(cluster or SIMULATED)
    if nodes > record.get("max_nodes", nodes):
        raise JobError(f"--nodes {nodes}: the cluster scales to {record['max_nodes']} nodes")
    cores = len(os.sched_getaffinity(0))
    record.setdefault("vcpus_per_node", max(1, cores // nodes))
    distribution = template["distribution"]["type"]
    command, outputs, local_in = local.job_command(template, source, inputs, out_root, nodes * ppn, extra)
    env = dict(interconnect.environment(record, ppn, distribution))
    if distribution == "pytorch":
        env.update(jobspec.DDP_WATCHDOG_ENV)
    env.update({k: str(v) for k, v in (template.get("environment_variables") or {}).items()})
    if distribution == "mpi":
        interconnect.check_under_mpi(env, "environment_variables of the job file")
    if record["gpus_per_node"]:
        notes.append(
            f"simulated cluster: the nodes get {record['vm_size']}'s settings without its "
            f"{record['gpus_per_node']} GPUs (TRAINING_GPUS_PER_NODE=0): the job trains on their CPUs"
        )
        env[interconnect.GPUS_PER_NODE] = "0"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's INFO lines, as the image does
    env.update(overrides or {})
    shared = [*outputs.values(), *local_in.values()]
    spec = runner.spec_for(template, nodes, shared, bool(record.get("infiniband")), env)
    return runner.Plan(command, distribution, nodes, ppn, env, spec), outputs, notes


def run(job_plan: runner.Plan, outputs: dict[str, pathlib.Path], heard: list[str] | None = None) -> int:
    """local.run's ending (the stop's exit 75, the summary) around the job on the simulated cluster."""
    argv = runner.start_line(job_plan)
    return local.run(argv, outputs, {}, execute=lambda env: runner.run(job_plan, heard=heard))


def main(args, template: dict, inputs: dict[str, str], out_root: pathlib.Path, extra, outputs, overrides) -> int:
    """`--target local --nodes N`, from launcher/__main__.py."""
    if args.controller != "auto":
        raise JobError(f"--controller {args.controller}: on simulated nodes the job starts as on Azure ML: drop it")
    if args.np != 2:
        raise JobError(f"--np {args.np} is for one machine; on simulated nodes say --processes-per-node {args.np}")
    if args.drill:
        raise JobError("--drill runs on one machine; on simulated nodes run: python -m launcher rehearse JOB --nodes N")
    cluster = None
    if args.cluster:
        if outputs is None:
            raise JobError(f"--cluster {args.cluster}: its settings come from the stack outputs: add --stack-outputs")
        cluster = outputs.cluster(args.cluster)
    job_plan, out, notes = plan(
        template, args.job, inputs, out_root, args.nodes, args.processes_per_node, extra, cluster, overrides
    )
    for line in notes:
        print(line, flush=True)
    if args.dry_run:
        print(" ".join(runner.start_line(job_plan)))
        return 0
    if args.auto_resume is not None:
        from .. import autoresume

        if "run" not in out:
            raise JobError(f"--auto-resume: {args.job.name} declares no `run` output, where runs leave checkpoints")
        heard: list[str] = []
        return autoresume.run_local(
            lambda: run(job_plan, out, heard), out["run"], job_plan.world, args.auto_resume, lambda: "\n".join(heard)
        )
    return run(job_plan, out)
