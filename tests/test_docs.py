"""The docs pages (docs/*.md, and CONTRIBUTING.md, which docs/contributing.md includes) keep
their commands true, as tests/test_readme.py keeps the README's: each command line of
train.py, evaluate.py, translate.py, `-m aiayn.visualize`, `-m aiayn.export` and
`-m aiayn.data.prepare`, long form or `aiayn <command>`, composes into a valid config (those
the README shows too are checked there). Over the README, the docs and the benchmark notes:
every `aiayn <command>` is one the console script has, every module and script a command
runs exists, and every relative link resolves (`mkdocs build --strict` checks the links
inside docs/ only). The getting-started page lists the whole command surface."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.test_readme import COMMANDS, CONSOLE, check_command, code_lines, commands

PAGES = [*sorted((REPO / "docs").glob("*.md")), REPO / "CONTRIBUTING.md"]
MARKDOWN = [
    REPO / "README.md",
    *PAGES,
    *(REPO / "benchmarks" / name for name in ("README.md", "RESULTS.md", "HISTORY.md")),
]
# modules that `python -m` runs and that are not aiayn's
OTHER_MODULES = {"pytest", "venv", "pip"}


def docs_commands() -> list:
    """The docs' commands that the README does not show, each once."""
    seen = {(entry, tuple(args)) for entry, args in COMMANDS}
    params = []
    for page in PAGES:
        for entry, args in commands(page):
            if (entry, tuple(args)) not in seen:
                seen.add((entry, tuple(args)))
                params.append(pytest.param(entry, args, id=f"{page.name}: {' '.join(args)}"))
    return params


def command_texts(path: Path) -> list[str]:
    """The code of a Markdown file: its code blocks' lines and its inline code spans."""
    text = path.read_text(encoding="utf-8")
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [*code_lines(path), *inline]


DOCS_COMMANDS = docs_commands()


def test_there_are_docs_pages_and_their_commands_are_found():
    assert {page.name for page in PAGES} >= {"index.md", "contributing.md", "CONTRIBUTING.md"}
    assert len(DOCS_COMMANDS) >= 20


@pytest.mark.slow  # about as long as the README's checks again; CI's slow layer runs it
@pytest.mark.parametrize(("entry", "args"), DOCS_COMMANDS)
def test_docs_command_composes_and_validates(entry, args, tmp_path):
    check_command(entry, args, tmp_path)


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_every_aiayn_command_is_one_the_console_script_has(path):
    for text in command_texts(path):
        for part in re.split(r"&&|\|\||[|;(]", text):
            words = part.split()
            if words[:1] == ["aiayn"] and len(words) > 1 and words[1][0] not in "-<":
                assert words[1] in CONSOLE, f"{path.name}: `{text}`: no `aiayn {words[1]}`"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_modules_and_scripts_that_commands_run_exist(path):
    for text in command_texts(path):
        for module in re.findall(r"python3? -m ([\w.]+)", text):
            if module in OTHER_MODULES:
                continue
            if module == "aiayn":  # a package runs its __main__
                module = "aiayn.__main__"
            assert importlib.util.find_spec(module), f"{path.name}: `{text}`: no {module}"
        for script in re.findall(r"python3? ([\w./-]+\.py)\b", text):
            assert (REPO / script).is_file(), f"{path.name}: `{text}`: no {script}"


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:|#", target):  # a URL, or an anchor on the same page
            continue
        assert (path.parent / target.split("#")[0]).exists(), f"{path.name}: {target}"


def test_the_commands_are_the_console_script_s():
    """CONSOLE, which these tests read commands by, is `aiayn`'s own list of commands."""
    from aiayn.cli.main import COMMANDS as SCRIPT

    assert {name: f"python {long}" for name, long in CONSOLE.items()} == {
        name: long_form for name, (_, _, long_form) in SCRIPT.items()
    }


def test_getting_started_lists_the_command_surface():
    text = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    for line in ("aiayn --help", "python -m aiayn --help"):
        assert f"`{line}`" in text
    for name, long in CONSOLE.items():
        assert f"`aiayn {name} --help`" in text
        assert f"`python {long}`" in text


def test_the_console_form_is_read_as_the_long_form(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "aiayn train model=tiny\n```bash\n"
        "aiayn train model=tiny  # a comment\n"
        "python -m aiayn.export ckpt_path=<ckpt> output_dir=ct2\n"
        "aiayn export ckpt_path=<ckpt> output_dir=ct2\n"
        "aiayn average a.ckpt b.ckpt -o averaged.ckpt\n"
        "aiayn train --help\n```\n",
        encoding="utf-8",
    )
    export = ("-m aiayn.export", ["ckpt_path=<ckpt>", "output_dir=ct2"])
    assert commands(page) == [("train.py", ["model=tiny"]), export, export]
