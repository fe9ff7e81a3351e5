"""Auto-resume that cannot loop (`--auto-resume N`, docs/preempted-and-resumed.md#my-job-died-overnight): when a followed job ends,
its ending (endings.py) decides: resume from its checkpoints, run the health check first and then resume, or stop
with one line saying why.

It cannot loop: the chain's budget (N resumes), each attempt's signature (class, exit code, position reached), the
money spent and the cap travel on the jobs themselves (Azure ML job tags; a local run's autoresume.json), so a
second launcher, or one restarted, continues the same chain; the next job's name is the chain's name and the
attempt's number, so two launchers following one chain submit it once. The same signature twice is a deterministic
failure and stops the chain. Nothing is decided while the job runs or while its status cannot be read
(azureml.follow, patient).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Callable

from azureaccess.errors import JobError, first_line

from . import endings

RESUME, CHECK_THEN_RESUME, STOP = "resume", "health check, then resume", "stop"
TAG = "autoresume_"  # the chain's tags: budget, attempt, history, spent_usd, cap_usd, chain, image
LOCAL_STATE = "autoresume.json"


@dataclasses.dataclass(frozen=True)
class Chain:
    """The state of one chain of attempts, the same on every launcher that follows it."""

    name: str | None  # the first job's name (a local run: its folder); None before it exists
    budget: int  # resumes allowed after the first attempt
    cap_usd: float | None = None
    attempt: int = 0  # 0: the first job
    history: tuple[str, ...] = ()  # the signatures of the attempts that ended
    spent_usd: float = 0.0
    image: str | None = None  # the first job's image by digest (azureml.pin_image): every resume runs it

    def tags(self) -> dict[str, str]:
        out = {
            TAG + "budget": str(self.budget),
            TAG + "attempt": str(self.attempt),
            TAG + "history": ";".join(self.history),
            TAG + "spent_usd": f"{self.spent_usd:.2f}",
        }
        if self.name:
            out[TAG + "chain"] = self.name
        if self.cap_usd is not None:
            out[TAG + "cap_usd"] = f"{self.cap_usd:.2f}"
        if self.image:
            out[TAG + "image"] = self.image
        return out

    @classmethod
    def from_tags(cls, tags: dict | None, own_name: str) -> Chain | None:
        """The chain a job belongs to, from its tags; None for a job submitted without auto-resume."""
        tags = tags or {}
        if TAG + "budget" not in tags:
            return None
        try:
            return cls(
                name=tags.get(TAG + "chain") or own_name,
                budget=int(tags[TAG + "budget"]),
                cap_usd=float(tags[TAG + "cap_usd"]) if tags.get(TAG + "cap_usd") else None,
                attempt=int(tags.get(TAG + "attempt", 0)),
                history=tuple(x for x in tags.get(TAG + "history", "").split(";") if x),
                spent_usd=float(tags.get(TAG + "spent_usd") or 0.0),
                image=tags.get(TAG + "image") or None,
            )
        except ValueError as e:
            raise JobError(f"job {own_name}: its auto-resume tags are not this tool's ({e}): {tags}") from None

    def after(self, ending: endings.Ending, spent_usd: float) -> Chain:
        """The chain for the next attempt, the one that ended counted."""
        return dataclasses.replace(
            self, attempt=self.attempt + 1, history=(*self.history, ending.signature), spent_usd=spent_usd
        )

    def next_name(self) -> str:
        return f"{self.name}-r{self.attempt + 1}"


@dataclasses.dataclass(frozen=True)
class Decision:
    action: str
    line: str


def decide(ending: endings.Ending, chain: Chain, spent_usd: float) -> Decision:
    """What to do after `ending`, the chain's attempt `chain.attempt`, with `spent_usd` spent on the chain so far."""
    if ending.kind == endings.COMPLETED:
        return Decision(STOP, "completed")
    if ending.kind in (endings.PERMANENT, endings.CANCELED):
        return Decision(STOP, f"not resumed: {ending.why}")
    if ending.signature in chain.history and ending.kind != endings.PREEMPTED:  # Azure's doing, not the job's
        first = chain.history.index(ending.signature) + 1
        return Decision(
            STOP,
            f"not resumed: attempt {first} ended the same way at the same step ({ending.signature}): a deterministic "
            "failure, which a resume would repeat",
        )
    if chain.attempt >= chain.budget:
        return Decision(STOP, f"not resumed: the chain's budget of {chain.budget} resume(s) is spent")
    if chain.cap_usd is not None and spent_usd >= chain.cap_usd:
        return Decision(STOP, f"not resumed: the chain has cost ${spent_usd:.2f}, at its cap of ${chain.cap_usd:.2f}")
    left = f"resume {chain.attempt + 1} of {chain.budget}"
    if ending.kind in (endings.HANG, endings.NODE_FAULT):
        named = f" (named: {', '.join(ending.hosts)})" if ending.hosts else ""
        return Decision(CHECK_THEN_RESUME, f"{left}, after the health check of the job's nodes{named}")
    return Decision(RESUME, left)


def _say(line: str) -> None:
    print(f"auto-resume: {line}", flush=True)


# ---- a local run: the same folder again, the payload resumes from its checkpoints


def run_local(
    run_once: Callable[[], int], run_folder: pathlib.Path, size: int, budget: int, heard: Callable[[], str] = str
) -> int:
    """Run the job (`run_once`: local.run) until the policy stops; the chain's state in <run>/autoresume.json, so
    a launcher started again on the same folder continues its chain. The exit status is the last attempt's.
    `heard`: what the launcher heard of the attempt's end (on simulated nodes, mpirun's word of a lost node)."""
    state = run_folder / LOCAL_STATE
    chain = _load_local(state) or Chain(run_folder.parent.name, budget)
    while True:
        started = time.time()
        code = run_once()
        read = endings.local_reader(run_folder)
        status = "Completed" if code == 0 else "Failed"
        ending = endings.classify(status, code, read, size, message=heard(), since=started)
        decision = decide(ending, chain, 0.0)
        _say(f"attempt {chain.attempt + 1} ended: {ending.line()}; {decision.line}")
        if decision.action == STOP:
            state.write_text(json.dumps(dataclasses.asdict(chain.after(ending, 0.0))) + "\n")
            return code
        chain = chain.after(ending, 0.0)
        state.write_text(json.dumps(dataclasses.asdict(chain)) + "\n")
        if decision.action == CHECK_THEN_RESUME:
            _say(
                "(a local run has no cluster to check: jobs/healthcheck-allreduce.yaml --target local checks this one)"
            )


def _load_local(path: pathlib.Path) -> Chain | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise JobError(
            f"{path}: not an auto-resume state this tool wrote ({e}): move it away to start a new chain"
        ) from None
    return Chain(**{**data, "history": tuple(data.get("history", ()))})


# ---- Azure ML: a new job writing to the same output folder (jobspec.resume), named by the chain


def run_azureml(
    build: Callable[[str | None], object],
    outputs,
    budget: int,
    cap_usd: float | None = None,
    *,
    follow_name: str | None = None,
    resume_from: str | None = None,
    health: Callable[[], int] | None = None,
    handoff: Callable[[object, str], int] | None = None,
    ml=None,
    credential=None,
) -> int:
    """Submit `build(resume_from)` (or follow the job `follow_name`, already submitted), and after each ending act on
    the decision. `build(earlier)`: the validated job, resuming from job `earlier` when given. `health()`: the
    health check on the job's cluster, nodes and processes (its exit status). `handoff(ml, name)`: instead of
    following the job here, hand the chain to a supervisor (supervisor.py) and return its status."""
    from . import azureml

    ml = ml or azureml.client(outputs)
    if follow_name:
        found = _get(ml, follow_name, outputs)
        if found is None:
            raise JobError(f"--follow {follow_name}: workspace {outputs['workspace_name']} has no such job")
        chain = Chain.from_tags(found.tags, follow_name) or Chain(follow_name, budget, cap_usd)
        if chain.budget != budget:
            _say(f"{follow_name}'s chain has a budget of {chain.budget} resume(s): that budget holds, not {budget}")
        name, url = follow_name, found.studio_url
    else:
        job = build(resume_from)
        azureml.pin_image(job, outputs, ml)
        chain = Chain(None, budget, cap_usd, image=getattr(getattr(job, "environment", None), "image", None))
        job.tags = {**(job.tags or {}), **chain.tags()}
        created = azureml.create(ml, job, outputs, resume_from)
        if isinstance(created, int):
            return created
        chain = dataclasses.replace(chain, name=created.name)
        name, url = created.name, created.studio_url
    if handoff is not None:
        return handoff(ml, name)
    while True:
        ended = azureml.follow(ml, name, url, outputs, patient=True)
        if isinstance(ended, int):
            return ended
        from .cost import after_watch

        cost = ((after_watch(ml, name, outputs) or {}).get("total") or {}).get("usd") or 0.0
        spent = chain.spent_usd + cost
        before = _get(ml, name, outputs)
        read = _blob_reader(outputs, before, name, credential)
        ending = endings.classify(
            ended.status, endings.exit_in(ended.cause), read, _size(before), ended.cause, _since(before)
        )
        code = azureml.report(ended)
        decision = decide(ending, chain, spent)
        _say(f"{name} (attempt {chain.attempt + 1} of chain {chain.name}) ended: {ending.line()}; {decision.line}")
        if decision.action == STOP:
            return code
        if decision.action == CHECK_THEN_RESUME and health is not None and health():
            _say("not resumed: the health check failed (nodes above); the chain stops here")
            return azureml.EXIT_ENDED_BADLY
        following = chain.after(ending, spent)
        next_name = chain.next_name()
        taken = _get(ml, next_name, outputs)
        if taken is None:
            job = build(name)
            job.name = next_name
            job.tags = {**(job.tags or {}), **following.tags()}
            if _is_asset(getattr(before, "code", None)):
                job.code = before.code  # a resume runs the chain's code, not what this checkout holds now
            if chain.image:
                job.environment.image = chain.image  # and the chain's image, wherever its tag has moved since
            try:
                created = azureml.create(ml, job, outputs, resume_from=name)
            except JobError:
                taken = _get(ml, next_name, outputs)  # refused because another launcher created it just now?
                if taken is None:
                    raise
            else:
                if isinstance(created, int):
                    return created
                chain, name, url = following, created.name, created.studio_url
                continue
        # another launcher follows this chain and resubmitted first
        _say(f"{next_name} was already submitted by another launcher following this chain: following it")
        chain = Chain.from_tags(taken.tags, next_name) or following
        name, url = next_name, taken.studio_url


def _get(ml, name: str, outputs):
    """The job, or None where the workspace has none of that name; a failure to read is retried (azureml)."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    from . import azureml

    refusals = 0
    while True:
        try:
            return ml.jobs.get(name)
        except ResourceNotFoundError:
            return None
        except AzureError as e:
            refusals = azureml.count_refusal(e, refusals, outputs, name)
            print(
                f"auto-resume: cannot read job {name} ({first_line(e, 200)}): nothing is done while it is unknown; "
                f"asking again in {azureml.POLL_SECONDS:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            azureml.pause(azureml.POLL_SECONDS)


def _is_asset(code) -> bool:
    return isinstance(code, str) and code.startswith(("azureml:", "/subscriptions/"))


def _since(job) -> float:
    """When the job was created (its files are newer), in wall-clock seconds; 0 where Azure ML does not say."""
    created = getattr(getattr(job, "creation_context", None), "created_at", None)
    return created.timestamp() if hasattr(created, "timestamp") else 0.0


def _size(job) -> int:
    nodes = getattr(getattr(job, "resources", None), "instance_count", None) or 1
    per_node = getattr(getattr(job, "distribution", None), "process_count_per_instance", None) or 1
    return int(nodes) * int(per_node)


def _blob_reader(outputs, job, name: str, credential) -> endings.Read:
    """The ended job's `run` folder in the logs container, read with the person's sign-in; a folder that cannot be
    read is said once and classified from the status and exit code alone."""
    from azure.core.exceptions import AzureError, ResourceNotFoundError

    from .cost.history import blob_folder
    from .jobspec import earlier_output_path

    path = getattr((getattr(job, "outputs", None) or {}).get("run"), "path", None)
    folder = blob_folder(outputs, earlier_output_path(path, name) if path else None)
    if folder is None:
        return lambda _: None
    if credential is None:
        from azureaccess.credential import azure_credential

        credential = azure_credential()
    client, failed = outputs.blob_container("logs", credential), []

    def read(relative: str) -> dict | None:
        if failed:
            return None
        try:
            data = json.loads(client.download_blob(folder + relative).readall())
        except (ResourceNotFoundError, ValueError):
            return None
        except AzureError as e:
            failed.append(e)
            _say(f"the run folder {folder} was not read ({first_line(e, 200)}): deciding from the status and exit code")
            return None
        return data if isinstance(data, dict) else None

    return read
