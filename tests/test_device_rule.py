"""The suite's rule (tests/README.md): a flag whose default depends on the device is tested with both values,
because CI has no GPU and would otherwise only ever run the CPU's value."""

import dataclasses
import pathlib

from payloads.common import config

TESTS = pathlib.Path(__file__).parent


def _spelled(args: tuple[str, ...]) -> str:
    return ", ".join(f'"{a}"' for a in args)


def _test_sources() -> str:
    return "\n".join(p.read_text() for p in TESTS.rglob("test_*.py") if p.name != pathlib.Path(__file__).name)


def test_every_value_of_every_device_dependent_flag_runs_in_a_test():
    text = _test_sources()
    missing = [
        f"{name}: {_spelled(args)}"
        for name, values in config.DEVICE_DEPENDENT.items()
        for args in values
        if args and _spelled(args) not in text
    ]
    assert not missing, "device-dependent flag values no test passes (tests/README.md, the device rule): " + "; ".join(
        missing
    )


def test_every_option_decided_by_the_device_is_registered():
    """A TrainConfig field defaulting to None whose value the device decides (like amp and channels_last) must be
    in config.DEVICE_DEPENDENT, so the rule above covers it."""
    # None for other reasons (documented): cache_dir is TMPDIR unless given
    not_device = {"data_dir", "batch_size", "global_batch_size", "base_lr", "cache_dir"}
    decided = {f.name for f in dataclasses.fields(config.TrainConfig) if f.default is None} - not_device
    assert decided <= set(config.DEVICE_DEPENDENT), decided - set(config.DEVICE_DEPENDENT)


def test_the_rule_on_what_ran_fails_without_the_multi_process_runs():
    """conftest.pytest_sessionfinish applies helpers.uncovered_device_values to every launch of a whole-suite run.
    A flag that only refusal tests (exit 2) and one-process runs pass is uncovered; a successful 2-process launch
    covers it."""
    from helpers import uncovered_device_values

    rule = {"channels_last": (("--channels-last",), ("--no-channels-last",)), "compile": (("--compile",), ())}
    refusals_only = [
        {"np": 2, "args": ["--channels-last", "--bogus"], "payload": "pytorch", "rc": 2},
        {"np": 1, "args": ["--no-channels-last", "--compile"], "payload": "pytorch", "rc": 0},
    ]
    assert uncovered_device_values(refusals_only, rule) == [
        "channels_last: --channels-last",
        "channels_last: --no-channels-last",
        "compile: --compile",
    ]
    trained = refusals_only + [{"np": 2, "args": ["--no-channels-last", "--compile"], "payload": "pytorch", "rc": 0}]
    assert uncovered_device_values(trained, rule) == ["channels_last: --channels-last"]
    # a value of two words counts only as written together
    pair = {"amp_dtype": (("--amp-dtype", "fp16"),)}
    assert uncovered_device_values([{"np": 2, "args": ["--amp-dtype", "bf16", "fp16"], "rc": 0}], pair)
