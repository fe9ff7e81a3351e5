import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEV_FILE = ROOT / "Pulumi.dev.yaml"
DATA_DEV_FILE = ROOT / "infra" / "data-stack" / "Pulumi.dev.yaml"
PROD_FILE = ROOT / "Pulumi.prod.yaml"
DATA_PROD_FILE = ROOT / "infra" / "data-stack" / "Pulumi.prod.yaml"


def one(mocks, type_suffix, name):
    found = [r for r in mocks.resources if r.type.endswith(type_suffix) and r.name == name]
    assert len(found) == 1, f"{type_suffix} {name}: {[r.name for r in mocks.of_type(type_suffix)]}"
    return found[0]
