"""Small ImageNet-like image trees, generated: real JPEG/PNG files of varied sizes, classes and modes."""

import pathlib

import numpy as np
import pytest
from PIL import Image


def write_tree(
    root: pathlib.Path, classes=("n01", "n02", "n03"), per_class=6, seed=0, val_per_class=0, flat_val=False
) -> pathlib.Path:
    """root/train/<class>/*.JPEG (+ root/val): images of different sizes, one grayscale and one PNG."""
    rng = np.random.default_rng(seed)
    labels = []
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in classes:
            if n == 0:
                continue
            folder = root / split / c
            if split == "val" and flat_val:
                folder = root / split
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                w, h = int(rng.integers(24, 64)), int(rng.integers(24, 64))
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                img = Image.fromarray(pixels)
                name = f"{c}_{i:03d}" if not flat_val or split == "train" else f"val_{len(labels):05d}"
                if i == 1:
                    img.convert("L").save(folder / f"{name}.JPEG")  # grayscale: re-encoded as RGB
                elif i == 2:
                    img.save(folder / f"{name}.png")
                else:
                    img.save(folder / f"{name}.JPEG", quality=95)
                if split == "val" and flat_val:
                    labels.append(c)
    if flat_val:
        (root / "val_labels.txt").write_text("".join(f"{c}\n" for c in labels))
    return root


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "images", val_per_class=2)


# ---------------------------------------------------------------------------------------------- Azurite


@pytest.fixture(scope="module")
def one_per_class(tmp_path_factory):
    """30 classes of one image each, as 6 WebDataset shards: a label names its image, so tests can follow every
    sample."""
    from datatools import prepare

    root = tmp_path_factory.mktemp("ids")
    write_tree(root / "img", classes=[f"c{i:02d}" for i in range(30)], per_class=1)
    prepare.run(root / "img", root / "out", shards=6, formats=["webdataset"], progress=False)
    return root / "out" / "webdataset"


import base64  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
AZURITE = ROOT / "toolchain" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"  # Azurite's built-in account


def _self_signed(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A throwaway certificate for 127.0.0.1: Azurite accepts OAuth only over HTTPS, and so does the SDK."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """A real Azure Storage blob server (Azurite) on a loopback port, with OAuth on; stopped after the tests.
    Yields (account URL, CA bundle for the SDK's connection_verify)."""
    if shutil.which("npm") is None:
        pytest.skip(
            "npm is not installed, so Azurite (the Azure Storage emulator) is not: install Node.js and "
            "npm, then toolchain/bootstrap.sh"
        )
    if not AZURITE.exists():
        pytest.fail(f"{AZURITE} is missing: run toolchain/bootstrap.sh (it runs npm ci in toolchain/)")
    folder = tmp_path_factory.mktemp("azurite")
    cert, key = _self_signed(folder)
    port = _free_port()
    cmd = [
        str(AZURITE),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--location",
        str(folder / "data"),
        "--oauth",
        "basic",
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--silent",
        "--skipApiVersionCheck",
        "--loose",
        "--disableTelemetry",
    ]
    log = open(folder / "azurite.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"Azurite exited {proc.returncode}: {(folder / 'azurite.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("Azurite did not listen within 30 s")
                time.sleep(0.2)
        yield f"https://127.0.0.1:{port}/{ACCOUNT}", str(cert)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class FakeEntraToken:
    """A TokenCredential handing out a JWT shaped like Entra ID's. Azurite's `--oauth basic` checks issuer,
    audience and lifetime but not the signature; `audience` set wrong plays a credential Azure refuses."""

    def __init__(
        self, audience: str = "https://storage.azure.com", tenant: str = "00000000-0000-0000-0000-000000000001"
    ):
        self.audience, self.tenant = audience, tenant

    def get_token(self, *scopes, **kwargs):
        from azure.core.credentials import AccessToken

        now = int(time.time())
        enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
        claims = {
            "aud": self.audience,
            "iss": f"https://sts.windows.net/{self.tenant}/",
            "nbf": now - 60,
            "iat": now - 60,
            "exp": now + 3600,
            "oid": "11111111-1111-1111-1111-111111111111",
            "tid": self.tenant,
        }
        return AccessToken(f"{enc({'alg': 'RS256', 'typ': 'JWT'})}.{enc(claims)}.c2lnbmF0dXJl", now + 3600)


@pytest.fixture
def storage(azurite, request):
    """A fresh container in Azurite and a function making clients of it (any container, any credential)."""
    from datatools import transfer

    url, ca = azurite

    def client(container: str, credential=None):
        return transfer.container_client(url, container, credential or FakeEntraToken(), connection_verify=ca)

    name = "data" + str(abs(hash(request.node.name)) % 10**8)
    c = client(name)
    c.create_container()
    yield client, name
    c.delete_container()
