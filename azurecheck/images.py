"""Each job file's image is in the stack's registry: the job files' `environment.image`
(`<<registry>>/<repository>:<tag>`, filled by jobspec with the registry's login server), looked up with
azure-containerregistry (the registry's data plane, Entra token exchanged for a registry token)."""

from __future__ import annotations

import pathlib

import yaml
from azure.core.exceptions import AzureError, ResourceNotFoundError

from .arm import describe
from .findings import FAIL, OK, Finding
from .stackfile import ROOT

JOBS = ROOT / "jobs"
TOKEN = "<<registry>>/"


def job_images(jobs: pathlib.Path = JOBS) -> dict[tuple[str, str], list[str]]:
    """(repository, tag) -> the job files that run it."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(jobs.glob("*.yaml")):
        image = str(((yaml.safe_load(path.read_text()) or {}).get("environment") or {}).get("image") or "")
        if image.startswith(TOKEN) and ":" in image:
            repo, _, tag = image[len(TOKEN) :].rpartition(":")
            found.setdefault((repo, tag), []).append(path.name)
    return found


def build_command(login_server: str, repo: str, tag: str) -> str:
    dockerfile = f"images/{repo.rsplit('/', 1)[-1]}/Dockerfile"
    return f"az acr build -r {login_server.split('.')[0]} -t {repo}:{tag} -f {dockerfile} --timeout 7200 ."


def check(login_server: str, credential, images: dict[tuple[str, str], list[str]], transport=None) -> list[Finding]:
    from azure.containerregistry import ContainerRegistryClient

    client = ContainerRegistryClient(
        f"https://{login_server}",
        credential,
        audience="https://management.azure.com",
        **({"transport": transport} if transport else {}),
    )
    findings = []
    for (repo, tag), jobs in images.items():
        name = f"image {repo}:{tag}"
        try:
            digest = client.get_tag_properties(repo, tag).digest
        except ResourceNotFoundError:
            findings.append(
                Finding(
                    FAIL,
                    name,
                    f"not in {login_server} (used by {', '.join(jobs)})",
                    build_command(login_server, repo, tag) + " (docs/images.md)",
                )
            )
        except AzureError as e:  # 401/403 included: a refused token exchange is a ClientAuthenticationError
            findings.append(
                Finding(
                    FAIL,
                    name,
                    describe(e, f"reading {login_server}"),
                    "reading tags needs AcrPull on the registry (the stack grants it to `users`: add yourself there); with "
                    "registryPublicAccess: false, only from inside the VNet",
                )
            )
        else:
            findings.append(Finding(OK, name, f"in {login_server} ({digest})"))
    return findings
