"""The guide and the docs hold together: every relative link and #anchor in README.md and docs/**/*.md
resolves (GitHub's heading slugs), every pointer the code gives a reader ("docs/<page>.md#<anchor>",
"README.md#<anchor>")
lands on a page and a heading that exist, every command the docs show exists (scripts are there and
executable, `python -m` modules import, `.venv/bin/` entries are in the venv), the README's two commands
come first, and its folder map is the repository's top-level folders. Runs on whatever tree it is in, so
after a merge it checks the merged pages too."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# A pointer in code or config: a repository-relative docs path, not part of a longer path or URL.
POINTER = re.compile(r"(?<![\w/.-])(docs/[\w./-]*?\.md|README\.md|tests/README\.md)(#[\w-]+)?")
TEXT_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".ini", ".md", ".json", ".csv", ""}


def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(lines outside fenced code, [(info string, lines) of each fenced block])."""
    prose, blocks, block, info = [], [], None, ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and block is None:
            block, info = [], line.strip()[3:].strip().lower()
        elif m and block is not None:
            blocks.append((info, block))
            block = None
        elif block is not None:
            block.append(line)
        else:
            prose.append(line)
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    found, seen = set(), {}
    prose, _ = split_fences(page.read_text())
    for line in prose:
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")  # GitHub numbers repeated headings
    return found


def strip_inline_code(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def test_slug_matches_github():
    assert slug("Why torch 2.14.1 + torchvision 0.29.1") == "why-torch-2141--torchvision-0291"
    assert slug("`allowedClientIps`") == "allowedclientips"
    assert (
        slug("The dev stack against Microsoft's secure-training reference")
        == "the-dev-stack-against-microsofts-secure-training-reference"
    )
    assert slug("channels_last through Horovod") == "channels_last-through-horovod"


def _links(page: pathlib.Path) -> list[str]:
    """Every link target outside fenced code, a link wrapped across lines included (the prose is read whole)."""
    prose, _ = split_fences(page.read_text())
    return [m.group(1) for m in LINK.finditer(strip_inline_code("\n".join(prose)))]


def broken_links(page: pathlib.Path) -> list[str]:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_catches_a_missing_page_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Its part\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#its-part) [ok](#b) [gone](c.md) [no anchor](a.md#not-a-heading) "
        "`[in code](c.md)` [web](https://example.com/x.md) [a link\nwrapped](d.md) [another](a.md#its-part)\n\n# B\n"
    )
    assert broken_links(page) == [
        "c.md: no such file",
        "a.md#not-a-heading: no heading with anchor #not-a-heading in a.md",
        "d.md: no such file",
    ]


def _repository_files() -> list[pathlib.Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.skip("not a git checkout: " + out.stderr.strip())
    return [ROOT / p for p in out.stdout.splitlines() if (ROOT / p).is_file()]


def test_every_pointer_in_the_repository_resolves():
    broken, checked = [], 0
    for f in _repository_files():
        if f.suffix not in TEXT_SUFFIXES and not f.name.startswith("Dockerfile"):
            continue
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for m in POINTER.finditer(text):
            path, anchor = m.group(1), (m.group(2) or "")[1:]
            checked += 1
            dest = ROOT / path
            where = f"{f.relative_to(ROOT)}: {m.group(0)}"
            if not dest.is_file():
                broken.append(f"{where}: no such page")
            elif anchor and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor}")
    assert checked > 20  # the scan found the code's pointers
    assert not broken, "\n".join(broken)


def _commands() -> list[tuple[pathlib.Path, str]]:
    """Shell lines of the ```bash blocks, and inline code that starts like a command, per page."""
    out = []
    for page in PAGES:
        prose, blocks = split_fences(page.read_text())
        for info, lines in blocks:
            if info.split()[:1] not in (["bash"], ["sh"], ["shell"], ["console"]):
                continue
            joined = "\n".join(lines).replace("\\\n", " ")
            out += [(page, line) for line in joined.splitlines() if line.strip()]
        for line in prose:
            for span in re.findall(r"`([^`]+)`", line):
                if re.match(r"^(scripts/|\.venv/bin/|(python3?|\.venv/bin/python) -m )", span):
                    out.append((page, span))
    return out


def _check_command(line: str) -> list[str]:
    line = re.sub(r"\s#.*$", "", line.strip())
    try:
        tokens = shlex.split(line, comments=False)
    except ValueError:
        tokens = line.split()
    problems = []
    for i, tok in enumerate(tokens):
        tok = tok.rstrip(";")
        if re.fullmatch(r"(scripts|toolchain|\.ci)/[\w.-]+", tok) and (
            i == 0 or tokens[i - 1] in ("bash", "&&", "||", "|", ";", "exec") or re.fullmatch(r"\w+=\S*", tokens[i - 1])
        ):
            p = ROOT / tok
            if not p.is_file():
                problems.append(f"{tok}: no such file")
            elif tokens[i - 1 : i] != ["bash"] and not os.access(p, os.X_OK):
                problems.append(f"{tok}: not executable")
        if tok == "-m" and i > 0 and re.search(r"(^|/)python3?(\.\d+)?$", tokens[i - 1]) and i + 1 < len(tokens):
            module = tokens[i + 1]
            if importlib.util.find_spec(module) is None:
                problems.append(f"python -m {module}: no such module")
        if tok.startswith(".venv/bin/"):
            name = tok[len(".venv/bin/") :]
            venv_bin = ROOT / ".venv" / "bin"
            if venv_bin.is_dir():
                if not (venv_bin / name).exists():
                    problems.append(f"{tok}: not in .venv/bin")
            elif name not in {"python", "pip", "pytest", "horovodrun"}:
                problems.append(f"{tok}: not something toolchain/bootstrap.sh installs")
    return problems


def test_every_command_the_docs_show_exists():
    commands = _commands()
    assert len(commands) > 30  # the scan found the docs' commands
    broken = [f"{page.relative_to(ROOT)}: {line.strip()}: {p}" for page, line in commands for p in _check_command(line)]
    assert not broken, "\n".join(broken)


def test_the_checker_catches_what_it_is_for():
    assert _check_command("scripts/no-such-script") == ["scripts/no-such-script: no such file"]
    assert _check_command(".venv/bin/python -m launcher.no_such_module") != []
    assert _check_command("NP=1 scripts/train-local --epochs 1") == []
    assert _check_command(".venv/bin/python -m benchmarks.plots   # draws") == []


def test_the_readme_starts_with_its_two_commands():
    _, blocks = split_fences((ROOT / "README.md").read_text())
    first = [line.split()[0] for line in blocks[0][1] if line.strip()]
    assert first == ["scripts/train-local", "scripts/test"]
    head = (ROOT / "README.md").read_text().split("```", 1)[0]
    assert len(head.splitlines()) <= 5, "the two commands are the first thing a reader sees"


def test_the_readme_folder_map_is_the_repository():
    files = _repository_files()
    top = {f.relative_to(ROOT).parts[0] for f in files if len(f.relative_to(ROOT).parts) > 1}
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Folders") :].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`/]+)/` \|", table, flags=re.M))
    assert listed == top, (
        f"README's folder map lists {sorted(listed - top)} that git does not have and misses {sorted(top - listed)}"
    )
    assert len(text.splitlines()) <= 150


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        for target in _links(page):
            path = target.partition("#")[0]
            if path and not re.match(r"^[a-z][a-z0-9+.-]*:", path):
                todo.append((page.parent / path).resolve())
    orphans = [str(p.relative_to(ROOT)) for p in PAGES if p.resolve() not in seen]
    assert not orphans, f"pages no link leads to from the README: {orphans}"


def _declared_options() -> dict[str, set[str]]:
    """Every option each group of payloads/common/options.py declares, by the group's table name."""
    import argparse

    from payloads.common import config, options

    found: dict[str, set[str]] = {}
    for group in options.ALL_GROUPS:
        parser = argparse.ArgumentParser(add_help=False)
        group.add(parser, options.Declared(config.TrainConfig(), ["resnet50"], ["synthetic"]))
        flags = {s for action in parser._actions for s in action.option_strings if s.startswith("--")}
        found.setdefault(group.title, set()).update(flags)
    return found


def test_the_payload_contracts_options_table_lists_every_declared_option():
    """docs/payload-contract.md's table of options by group is what users read; two releases added options to
    config.py without a row naming them. Every declared option appears in the table (as --x or --x/--no-x)."""
    text = (ROOT / "docs" / "payload-contract.md").read_text()
    table = "\n".join(line for line in text.splitlines() if line.startswith("| "))
    named = set(re.findall(r"`(--[a-z0-9-]+)", table)) | set(re.findall(r"/(--[a-z0-9-]+)`", table))
    missing = sorted(o for flags in _declared_options().values() for o in flags if o not in named)
    assert not missing, f"docs/payload-contract.md's options table does not name: {', '.join(missing)}"


def test_the_platform_docs_name_every_stack_output():
    """docs/platform.md's "Stack outputs: the contract" is what job submission relies on: every output the dev
    stack renders (infra/review/dev-outputs.json, written by the program under mocks) is named there."""
    import json

    outputs = json.loads((ROOT / "infra" / "review" / "dev-outputs.json").read_text())
    text = (ROOT / "docs" / "platform.md").read_text()
    section = text.split("## Stack outputs: the contract", 1)[1].split("\n## ", 1)[0]
    missing = sorted(k for k in outputs if k != "rendered_under_mocks" and f"`{k}`" not in section)
    assert not missing, f"docs/platform.md#stack-outputs-the-contract does not name: {', '.join(missing)}"
