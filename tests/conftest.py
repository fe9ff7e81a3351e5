import pathlib
import sys

# Tests import the project's packages (payloads, infra/trainingplatform, policy) from the checkout.
ROOT = pathlib.Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "infra", ROOT / "policy", pathlib.Path(__file__).parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
