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
    not_device = {"data_dir", "batch_size", "global_batch_size", "base_lr"}  # None for other reasons (documented)
    decided = {f.name for f in dataclasses.fields(config.TrainConfig) if f.default is None} - not_device
    assert decided <= set(config.DEVICE_DEPENDENT), decided - set(config.DEVICE_DEPENDENT)
