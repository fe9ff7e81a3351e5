"""python -m launcher JOB.yaml [--target azureml|local] [--dry-run] [--auto-resume N] ... [-- extra payload arguments]
python -m launcher preflight --stack STACK [--data-stack STACK] | doctor --stack STACK (azurecheck/, the same as
    python -m azurecheck preflight|doctor)
python -m launcher cost JOB_NAME --stack STACK [--json PATH] (launcher/cost/)
python -m launcher nodes REPORT --stack-outputs F --cluster C [--job NAME] (launcher/nodes.py)
python -m launcher rehearse JOB --nodes N [--faults ...] (launcher/simcluster/rehearse.py: faults on simulated nodes)"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import shlex
import sys

import yaml

from azureaccess import stack
from azureaccess.errors import JobError
from azurecheck import cli as checks_cli

from . import azureml, jobspec, local, prices, target


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher",
        description=(
            "Fill a job definition from the stack outputs, validate it offline with azure-ai-ml, then submit it "
            "to Azure ML, run it here with horovodrun, or print it with its hourly cost. "
            "Checks against Azure: python -m launcher preflight|doctor --help (docs/preflight-and-doctor.md). "
            "What a job cost: python -m launcher cost --help (docs/job-cost.md#what-a-job-cost)."
        ),
    )
    p.add_argument("job", type=pathlib.Path, help="a job definition, e.g. jobs/pytorch-resnet50-synthetic.yaml")
    p.add_argument("--target", choices=("azureml", "local"), default="azureml")
    p.add_argument("--dry-run", action="store_true", help="print the resolved job and its hourly cost; submit nothing")
    p.add_argument(
        "--backend",
        choices=jobspec.BACKENDS,
        default=None,
        help="PyTorch jobs: horovod (mpi distribution) or ddp (PyTorch DDP, Azure ML's pytorch "
        "distribution; torchrun here). Default: the job file's distribution",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--stack-outputs", type=pathlib.Path, help="JSON from `pulumi stack output --json`")
    src.add_argument("--stack", help="ask the Pulumi CLI for this stack's outputs")
    p.add_argument("--cluster", help="compute cluster (a key of the stack output `clusters`)")
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="nodes (default: the job file's instance_count); local: run on this many simulated nodes, each with "
        "its own hostname, network, /tmp and /dev/shm, started as Azure ML starts the job (docs/rehearse.md)",
    )
    p.add_argument(
        "--processes-per-node", type=int, default=None, help="default: the cluster's GPUs per node (1 on CPU clusters)"
    )
    p.add_argument("--no-stream", action="store_true", help="submit and return without following the logs")
    p.add_argument(
        "--health-check",
        action="store_true",
        help="Azure ML: first run jobs/healthcheck-allreduce.yaml on this job's cluster, nodes and processes per "
        "node, print each node's verdict, and submit this job only if every node passed (docs/health-check.md#a-bad-node)",
    )
    p.add_argument(
        "--skip-quota-check",
        action="store_true",
        help="submit without first checking the cluster's Azure ML quota for the job's nodes",
    )
    p.add_argument(
        "--input-mode",
        metavar="ro_mount|download",
        help="how the job reads its inputs: ro_mount (the job file's default: streamed through a "
        "block cache on the node's disk) or download (copied to the node's disk before start)",
    )
    p.add_argument(
        "--resume-from",
        metavar="JOB_NAME|FOLDER",
        help="a new job that writes to this earlier job's outputs and resumes from its newest checkpoint; "
        "or a run folder of the logs container (runs/<job>/<name>/), e.g. of a workspace since "
        "destroyed",
    )
    p.add_argument(
        "--auto-resume",
        type=int,
        metavar="N",
        default=None,
        help="when the job ends without completing, decide from how it ended: resume it from its checkpoints (at "
        "most N times), run the health check first (a hang, a node fault), or stop with one line saying why (a "
        "refused configuration, a cancel, the same failure twice at the same step); docs/preempted-and-resumed.md#my-job-died-overnight",
    )
    p.add_argument(
        "--auto-resume-cap",
        type=float,
        metavar="USD",
        default=None,
        help="Azure ML, --auto-resume: no resume once the chain's jobs have cost this much (their cost ledgers)",
    )
    p.add_argument(
        "--follow",
        metavar="JOB_NAME",
        help="Azure ML, --auto-resume: follow this job, already submitted (e.g. by a launcher that stopped), and "
        "continue its chain instead of submitting a new one",
    )
    p.add_argument(
        "--supervise",
        nargs="?",
        const="",
        default=None,
        metavar="CPU_CLUSTER",
        help="Azure ML, --auto-resume: submit the job, then a small supervisor job on a CPU cluster (default: the "
        "stack's first) that follows it and resumes it with your identity, so this machine need not stay on; with "
        "--follow, hand an existing chain to a supervisor (docs/preempted-and-resumed.md#the-supervisor-job)",
    )
    p.add_argument("--np", type=int, default=2, help="local: Horovod processes on this machine")
    p.add_argument("--input", action="append", default=[], metavar="NAME=PATH", help="local: a job input's local path")
    p.add_argument("--output-dir", type=pathlib.Path, default=None, help="local: where the job's outputs go")
    p.add_argument(
        "--drill",
        choices=("term", "kill"),
        default=None,
        help="local: a preemption drill: the job uninterrupted, then again with SIGTERM (term) or SIGKILL (kill) "
        "sent to a random rank at a random step, then resumed; reports the steps lost and whether the result "
        "equals the uninterrupted run (docs/preempted-and-resumed.md#a-preemption-drill)",
    )
    p.add_argument("--drill-seed", type=int, default=None, help="local, --drill: repeat a drill's rank and step")
    p.add_argument(
        "--controller",
        choices=local.CONTROLLERS,
        default="auto",
        help="local: Horovod's controller; auto = MPI where Horovod has it, else Gloo",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "cost":
        from . import cost

        return cost.main(argv[1:])
    if argv and argv[0] == "rehearse":
        from .simcluster import rehearse

        return rehearse.main(argv[1:])
    if argv and argv[0] == "nodes":
        from . import nodes

        return nodes.main(argv[1:])
    if argv and argv[0] in checks_cli.COMMANDS:
        return checks_cli.main(argv, prog="python -m launcher")
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    args = parser().parse_args(argv)
    try:
        return run(args, extra)
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _outputs(args) -> stack.StackOutputs | None:
    if args.stack_outputs:
        return stack.load_file(args.stack_outputs, rendered_ok=args.dry_run or args.target == "local")
    if args.stack:
        return stack.load_from_pulumi(args.stack)
    return None


def run(args, extra: list[str]) -> int:
    template = jobspec.with_backend(jobspec.read_template(args.job), args.backend, args.job, extra)
    outputs = _outputs(args)
    if args.drill and args.target != "local":
        raise JobError(
            "--drill is for --target local; on a cluster, cancel the running job (a SIGTERM to every rank) and "
            "submit it again with --resume-from: docs/preempted-and-resumed.md#a-preemption-drill"
        )
    _check_auto_resume(args)
    if args.target == "local":
        return _run_local(args, extra, template, outputs)
    return _run_azureml(args, extra, template, outputs)


def _run_local(args, extra: list[str], template: dict, outputs: stack.StackOutputs | None) -> int:
    if args.input_mode:
        raise JobError("--input-mode is for Azure ML jobs; here inputs are local folders (--input NAME=PATH)")
    if args.health_check:
        raise JobError("--health-check is for Azure ML jobs; here run jobs/healthcheck-allreduce.yaml --target local")
    if args.resume_from:
        raise JobError(
            "--resume-from is for Azure ML jobs; here, pass the earlier run's folder as --output-dir "
            "and the payload resumes from its checkpoints"
        )
    inputs = {}
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise JobError(f"--input {item!r}: expected NAME=PATH, e.g. --input imagenet=/data/imagenet")
        inputs[name] = path
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_root = args.output_dir or jobspec.ROOT / "runs" / f"{template.get('display_name', args.job.stem)}-{stamp}"
    overrides = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "120"}
    if args.nodes is not None:
        from . import simcluster

        return simcluster.main(args, template, inputs, out_root.resolve(), extra, outputs, overrides)
    if args.drill:
        if args.dry_run:
            raise JobError("--drill runs the job three times; --dry-run prints one command: drop one of them")
        from . import drill

        def plan_for(folder):
            return local.plan(template, args.job, inputs, folder, args.np, extra, args.controller)

        return drill.drill(
            plan_for,
            lambda a, o: local.run(a, o, overrides),
            out_root.resolve(),
            args.drill,
            args.drill_seed,
            args.np,
        )
    argv, out = local.plan(template, args.job, inputs, out_root.resolve(), args.np, extra, args.controller)
    if args.dry_run:
        print(shlex.join(argv))
        return 0
    if args.auto_resume is not None:
        from . import autoresume

        if "run" not in out:
            raise JobError(f"--auto-resume: {args.job.name} declares no `run` output, where runs leave checkpoints")
        return autoresume.run_local(lambda: local.run(argv, out, overrides), out["run"], args.np, args.auto_resume)
    return local.run(argv, out, overrides)


def _run_azureml(args, extra: list[str], template: dict, outputs: stack.StackOutputs | None) -> int:
    if outputs is None:
        raise JobError(
            "--target azureml needs the stack outputs: --stack-outputs outputs.<stack>.json "
            "(from `pulumi stack output --json`) or --stack <name>"
        )
    nodes = args.nodes if args.nodes is not None else (template.get("resources") or {}).get("instance_count", 1)
    on = target.resolve(outputs, args.cluster, nodes, args.processes_per_node)
    job = jobspec.fill(template, outputs, on, extra, args.input_mode, args.job)
    job, cache_line = _decoded_cache(job, outputs, args, on)
    filled = job
    if args.resume_from:
        job = jobspec.resume(job, args.resume_from, args.job)
    sdk_job = jobspec.validate(job, args.job)
    if args.dry_run:
        if outputs.rendered:
            print(f"# stack outputs rendered under mocks ({outputs.values[stack.RENDERED]})")
        print(yaml.safe_dump(job, sort_keys=False), end="")
        if cache_line:
            print(f"# {cache_line}")
        low = on.cluster.get("low_priority", False)
        cost, how = prices.hourly(on.vm_size, nodes, low, outputs.values.get("location"))
        print(f"# cost of one hour: {f'${cost:.2f}' if cost is not None else 'unknown'} ({how})")
        if args.resume_from and jobspec.is_folder(args.resume_from):
            print(
                f"# --resume-from {args.resume_from}: its checkpoints are not checked (dry run); the submission "
                "refuses a folder without any"
            )
        elif args.resume_from:
            print(
                f"# --resume-from {args.resume_from}: not checked against the workspace (dry run). The output "
                f"path above assumes {args.resume_from} wrote under its own name; if it was itself resumed (a "
                "chain), the submission takes the folder Azure ML records for it: confirmed only at submission"
            )
        return 0
    if cache_line:
        print(cache_line, flush=True)
    if not args.skip_quota_check:
        azureml.check_quota(outputs, args.cluster, nodes)
    if args.health_check:
        from . import nodes as node_check

        code = node_check.run_health_check(outputs, on)
        if code:
            print("error: --health-check: the training job was not submitted (failed nodes above)", file=sys.stderr)
            return code
    if args.auto_resume is not None:
        from . import autoresume
        from . import nodes as node_check

        def build(earlier: str | None):
            return jobspec.validate(jobspec.resume(filled, earlier, args.job) if earlier else filled, args.job)

        return autoresume.run_azureml(
            build,
            outputs,
            args.auto_resume,
            args.auto_resume_cap,
            follow_name=args.follow,
            resume_from=args.resume_from,
            health=lambda: node_check.run_health_check(outputs, on),
            handoff=_handoff(args, outputs, on, extra, template),
        )
    return azureml.submit(sdk_job, outputs, stream=not args.no_stream, resume_from=args.resume_from)


def _decoded_cache(job: dict, outputs, args, on: target.Target) -> tuple[dict, str | None]:
    """--cache-decoded: its place on the node, sized before submitting (launcher/cachehome.py); a dry run assumes
    ImageNet's counts instead of reading the manifest."""
    if "--cache-decoded" not in job["command"]:
        return job, None
    from . import cachehome

    if args.dry_run:
        counts = cachehome.imagenet("ImageNet's counts: a dry run reads no manifest")
    else:
        counts = cachehome.counts_from_manifest(outputs, job)
    return cachehome.place(job, on.size.memory_gib if on.size else None, on.vm_size, on.nodes, counts)


def _handoff(args, outputs, on: target.Target, extra: list[str], template: dict):
    """--supervise: what hands the chain to a supervisor job (launcher/supervisor.py), or None."""
    if args.supervise is None:
        return None
    from . import supervisor

    cpu = supervisor.cpu_cluster(outputs, args.supervise)

    def handoff(ml, name: str) -> int:
        argv = supervisor.launcher_args(args.job, args, on, name, extra)
        return supervisor.submit(ml, outputs, cpu, argv, args.job, template)

    return handoff


def _check_auto_resume(args) -> None:
    """--auto-resume and its companions, before anything runs or is submitted."""
    if args.auto_resume is None:
        if args.auto_resume_cap is not None or args.follow or args.supervise is not None:
            raise JobError(
                "--auto-resume-cap, --follow and --supervise belong to --auto-resume N: add it (N: resumes allowed)"
            )
        return
    if args.auto_resume < 0:
        raise JobError(f"--auto-resume {args.auto_resume}: the resumes allowed, 0 or more (e.g. --auto-resume 3)")
    if args.auto_resume_cap is not None and args.auto_resume_cap <= 0:
        raise JobError(f"--auto-resume-cap {args.auto_resume_cap:g}: a cost in US dollars above 0")
    if args.drill:
        raise JobError("--drill resumes the stopped run itself (its third run): drop --auto-resume")
    if args.target == "local" and (args.auto_resume_cap is not None or args.follow or args.supervise is not None):
        raise JobError(
            "--auto-resume-cap, --follow and --supervise are for Azure ML jobs; a local chain lives in its output folder"
        )
    if args.no_stream:
        raise JobError("--auto-resume follows the job to decide when it ends: drop --no-stream")
    if args.follow and args.resume_from:
        raise JobError("--follow continues a job's own chain; --resume-from starts a new one: drop one of them")


if __name__ == "__main__":
    sys.exit(main())
