"""Each payload declares its own options: what its --help lists it accepts, acts on, and starts from the default
shown; the options of other payloads are refused by name. Read from each payload's real --help, parsed by its
real main() up to the point where training would start."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib
import re

import pytest
from test_code_homes import ROOT, imports, module_name

from payloads.common import config, options
from payloads.common.errors import ConfigError

PAYLOADS = {
    "pytorch": "payloads.pytorch.train",
    "tensorflow": "payloads.tensorflow.train",
    "keras": "payloads.keras.train",
    "segmentation": "payloads.segmentation.train",
}
MODEL = {"pytorch": "tiny_cnn", "tensorflow": "tiny_cnn", "keras": "tiny_cnn", "segmentation": "unet_tiny"}


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Parse as a job would, here: the default output folder in a scratch directory, no Azure ML variables."""
    for name in ("AZUREML_OUTPUT_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    return tmp_path


def baseline(payload: str, tmp: pathlib.Path) -> list[str]:
    return ["--data-dir", str(tmp / "data")] if payload == "segmentation" else []  # land cover needs its tiles


def configured(payload: str, argv: list[str], monkeypatch) -> dict:
    """The payload's main() on argv, stopped where it would train: {field: value} of what it would train with
    (TrainConfig's, and the land-cover payload's own options)."""
    module = importlib.import_module(PAYLOADS[payload])
    got = {}

    def capture(cfg, seg=None):
        got.update(dataclasses.asdict(cfg))
        if seg is not None:
            got.update(dataclasses.asdict(seg))

    monkeypatch.setattr(module, "run", capture)
    code = module.main(argv)
    assert code == 0 and got, f"{payload} refused {argv}"
    return got


@dataclasses.dataclass
class Listed:
    flags: list[str]
    takes_value: bool
    choices: list[str]
    default: str | None  # as --help shows it; None: not shown


def listed_options(payload: str, capsys) -> list[Listed]:
    module = importlib.import_module(PAYLOADS[payload])
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    entries: list[str] = []
    current = None
    for line in text.splitlines():
        if re.match(r"^  -", line):
            entries.append(line.strip())
            current = len(entries) - 1
        elif current is not None and line.startswith("    "):
            entries[current] += "  " + line.strip()  # two spaces: the invocation ends at the first
        else:
            current = None
    options = []
    for entry in entries:
        invocation, _, help_text = entry.partition("  ")
        tokens = [t.rstrip(",") for t in invocation.split()]
        flags = [t for t in tokens if t.startswith("--")]
        if flags == ["--help"]:
            continue
        values = [t for t in tokens if not t.startswith("-")]
        choices = values[0].strip("{}").split(",") if values and values[0].startswith("{") else []
        shown = re.search(r"\(default: (.*)\)\s*$", " ".join(help_text.split()))
        options.append(Listed(flags, bool(values), choices, shown.group(1) if shown else None))
    return options


def sample(payload: str, option: Listed, tmp: pathlib.Path) -> list[str]:
    """Arguments that set `option` to a value other than its default, valid for the payload."""
    flag = option.flags[0]
    if not option.takes_value:  # a switch: the spelling that differs from the default
        return [option.flags[-1] if option.default == "True" else option.flags[0]]
    special = {
        "--model": [MODEL[payload]],
        "--data": ["imagefolder" if payload == "pytorch" else "tfrecord", "--data-dir", str(tmp / "data")],
        "--global-batch-size": ["64"],
        "--base-lr": ["0.5"],
        "--lr-decay-epochs": ["10,20"],
        "--output-dir": [str(tmp / "elsewhere")],
        "--decoder": ["pillow"],
        "--cache-dir": [str(tmp / "cache"), "--cache-decoded"],  # refused without the cache it places
        "--stall-timeout": ["900"],  # default "auto"
        "--checkpoint-every-minutes": ["30"],  # default "auto"
        "--ema-decay": ["0.999"],  # below 1
    }
    if flag == "--image-size":  # land cover: a multiple of the encoder's stride
        return [flag, str(2 * int(option.default))]
    if flag == "--data-dir":
        return (
            ["--data-dir", str(tmp / "other-data")]
            if payload == "segmentation"
            else ["--data", "imagefolder" if payload == "pytorch" else "tfrecord", "--data-dir", str(tmp / "data")]
        )
    if flag in special:
        return [flag, *special[flag]]
    if option.choices:
        return [flag, next(c for c in option.choices if c != option.default)]
    if option.default is not None and re.fullmatch(r"-?\d+", option.default):
        return [flag, str(int(option.default) + 1)]
    if option.default is not None and re.fullmatch(r"[\d.e+-]+", option.default):
        return [flag, str(float(option.default) * 2 or 1.0)]
    raise AssertionError(f"{payload}: no sample value for {flag} (default {option.default!r}): add one here")


def closure(entry: str) -> list[pathlib.Path]:
    """The payloads modules the entry point imports, at any depth (function-level imports included)."""
    seen, todo, files = set(), [entry], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = ROOT.joinpath(*name.split("."))
        path = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        if not path.is_file():
            continue
        files.append(path)
        for _, imported, _, _ in imports(module_name(path), path.name == "__init__.py", ast.parse(path.read_text())):
            parts = imported.split(".")
            todo += [".".join(parts[:i]) for i in range(2, len(parts) + 1)]  # packages run their __init__
    return files


def fields_read(entry: str) -> set[str]:
    """Configuration fields the payload's code reads: cfg.X / seg.X (also run.cfg.X, self.seg.X) / getattr(cfg, "X"),
    and TrainConfig's own reads outside its checks (validate)."""
    found = set()
    for path in closure(entry):
        tree = ast.parse(path.read_text())
        checks = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and f.name in ("validate", "to_json")
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if id(node) in checks:
                continue
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and (
                    isinstance(node.value, ast.Name)
                    and node.value.id in ("cfg", "seg") + (("self",) if path.name == "config.py" else ())
                    # the loop's state and a task's options: run.cfg.X, self.seg.X
                    or isinstance(node.value, ast.Attribute)
                    and node.value.attr in ("cfg", "seg")
                )
            ):
                found.add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                found.add(node.args[1].value)
    return found


def _dest(option: Listed, changed: set[str]) -> str:
    if len(changed) == 1:
        return next(iter(changed))
    names = {f.lstrip("-").removeprefix("no-").replace("-", "_") for f in option.flags}
    (dest,) = names & changed
    return dest


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_option_in_help_is_accepted_used_and_starts_at_the_default_shown(payload, isolated, monkeypatch, capsys):
    options = listed_options(payload, capsys)
    assert len(options) > 20
    base = configured(payload, baseline(payload, isolated), monkeypatch)
    read = fields_read(PAYLOADS[payload])
    problems = []
    for option in options:
        args = sample(payload, option, isolated)
        try:
            got = configured(payload, baseline(payload, isolated) + args, monkeypatch)
        except AssertionError:
            problems.append(f"{args}: refused (see the captured stderr)")
            continue
        changed = {k for k in got if got[k] != base.get(k)} - {"options"}
        if not changed:
            problems.append(f"{args}: changes nothing the payload trains with")
            continue
        unread = sorted(changed - read)
        if unread:
            problems.append(f"{args}: sets {unread}, which {payload}'s code never reads")
        dest = _dest(option, changed)
        if base[dest] is None and dest in config.DEVICE_DEPENDENT:  # decided by the device: the help says how
            if "GPU" not in (option.default or ""):
                problems.append(f"{option.flags}: decided by the device, and its help does not say how")
        elif option.default is not None and option.default != str(base[dest]):
            problems.append(f"{option.flags}: --help shows default {option.default}, the payload uses {base[dest]}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_metrics_config_records_what_help_lists(payload, isolated, monkeypatch, capsys):
    """metrics.json's run.config is TrainConfig.to_json(): the options the payload declared, nothing else."""
    options = listed_options(payload, capsys)
    module = importlib.import_module(PAYLOADS[payload])
    got = []
    monkeypatch.setattr(module, "run", lambda cfg, seg=None: got.append(cfg))
    assert module.main(baseline(payload, isolated)) == 0
    flags = {f.lstrip("-").removeprefix("no-").replace("-", "_") for o in options for f in o.flags}
    recorded = set(got[0].to_json())
    assert recorded <= flags and recorded, recorded - flags
    assert "shuffle_buffer" not in recorded or payload == "pytorch"


REFUSALS = [
    # (payload, argv, message): another payload's option, named with the payloads that take it or the reason
    ("tensorflow", ["--shuffle-buffer", "100"], "--shuffle-buffer is an option of the PyTorch payloads"),
    ("tensorflow", ["--cache-decoded"], "--cache-decoded is an option of the PyTorch payloads"),
    ("keras", ["--amp-dtype", "bf16"], "--amp-dtype is an option of the PyTorch payloads"),
    ("keras", ["--adasum"], "--adasum is not available in the Keras payload"),
    ("tensorflow", ["--no-channels-last"], "TensorFlow always trains NHWC"),
    ("keras", ["--backward-passes-per-step", "2"], "--backward-passes-per-step is a PyTorch payload option"),
    ("keras", ["--model", "resnet18"], "unknown model 'resnet18'"),
    ("pytorch", ["--xla"], "--xla is an option of the TensorFlow and Keras payloads"),
    (
        "segmentation",
        ["--shuffle-buffer", "100"],
        "--shuffle-buffer is an option of the PyTorch payloads (image classification only)",
    ),
    ("segmentation", ["--startup-steps", "3"], "--startup-steps is an option of the PyTorch payloads"),
    ("segmentation", ["--workers", "2"], "--workers is not an option of the segmentation payload"),
    ("segmentation", ["--xla"], "--xla is an option of the TensorFlow and Keras payloads"),
    ("segmentation", ["--data", "tiles"], "--data is an option of the image-classification payloads"),
    (
        "pytorch",
        ["--cache-dir", "/tmp"],
        "--cache-dir is where --cache-decoded keeps decoded images: add --cache-decoded",
    ),
]


@pytest.mark.parametrize("payload, argv, message", REFUSALS, ids=[f"{p}{a[0]}" for p, a, _ in REFUSALS])
def test_options_of_other_payloads_are_refused_by_name(payload, argv, message, isolated, monkeypatch, capsys):
    module = importlib.import_module(PAYLOADS[payload])
    monkeypatch.setattr(module, "run", lambda *a: pytest.fail("trained with a refused option"))
    assert module.main(baseline(payload, isolated) + argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    with pytest.raises(SystemExit):  # an option no payload has is argparse's usage error, exit 2 too
        module.main(baseline(payload, isolated) + ["--no-such-option"])


def test_a_declared_option_is_one_add_argument_in_its_group():
    """The groups are the only place options are declared: every TrainConfig field but the bookkeeping one is
    declared by exactly one group, so a new option is one line in one group."""
    owners: dict[str, list[str]] = {}
    for dest, group in options.owners_of_flags().values():
        owners.setdefault(dest, [])
        if group.title not in owners[dest]:
            owners[dest].append(group.title)
    fields = {f.name for f in dataclasses.fields(config.TrainConfig)} - {"options"}
    assert fields == set(owners), fields ^ set(owners)
    assert all(len(titles) == 1 for titles in owners.values()), owners
    with pytest.raises(ConfigError):
        options.parse(["--xla"], "x", "", ["resnet50"])
