"""Every command the README and docs/ show is one the CLI takes: each ``fedhype <command> --flag`` names an option
of that command, and each ``--set section.key=value`` is a setting the job accepts with that value.

A renamed or removed option otherwise leaves the README telling users a command that fails (the guide's rule:
keep the README true with every change). Commands are read from code blocks (comments cut) and from inline
`` `fedhype …` `` spans.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import typer.main

from fedhype.cli.main import app
from fedhype.errors import ValidationError
from fedhype.pipeline.config import resolve, train_config

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(text: str) -> list[tuple[int, str]]:
    """(line number, the words after ``fedhype``) of every command shown in ``text``."""
    out, block = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            block = not block
            continue
        if block and not line.lstrip().startswith("#"):
            code = line.split(" #", 1)[0]
            out += [(n, m.group(1)) for m in re.finditer(r"(?:^|[\s;&|(])(?:\.venv/bin/)?fedhype\s+([^#]*)", code)]
        out += [(n, m.group(1)) for m in re.finditer(r"`(?:\.venv/bin/)?fedhype\s+([^`]*)`", line)]
    return out


def _unknown_flags(text: str) -> list[str]:
    root = typer.main.get_command(app)
    bad = []
    for n, rest in _commands(text):
        words = rest.replace("'", " ").replace('"', " ").split()
        cmd, path = root, []
        while words and isinstance(cmd, click.Group) and words[0] in cmd.commands:
            cmd = cmd.commands[words[0]]
            path.append(words.pop(0))
        if not path:  # prose ("fedhype is …"), not a command
            continue
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
        bad += [f"line {n}: fedhype {' '.join(path)} {w}" for w in words
                if w.startswith("--") and w.split("=")[0] not in known]
    return bad


def _check_setting(*items: str) -> None:
    """Refuse (ValidationError) a ``section.key=value`` the job would refuse: an unknown key, or a [train] / [model]
    value its configuration refuses."""
    train_config(resolve(None, list(items)))


def test_the_parser_finds_the_commands_and_would_catch_a_wrong_flag():
    text = (ROOT / "README.md").read_text()
    assert len(_commands(text)) >= 100
    assert _unknown_flags("```bash\nfedhype train --store s --epsilonn 1   # a typo\n```\n") == [
        "line 2: fedhype train --epsilonn"]
    assert _unknown_flags("run it with `fedhype synthesize --run r --per-clas 5`.") == [
        "line 1: fedhype synthesize --per-clas"]
    assert _unknown_flags("`fedhype prototypes dp-linear --epsilon 1` and `fedhype budget --site d`") == []
    for wrong in ("train.epsilonn=1", "model.located_share=2", "train.epsilon=-1"):  # what the --set check catches
        with pytest.raises(ValidationError):
            _check_setting(wrong)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_flag_shown_is_an_option_of_its_command(page):
    assert _unknown_flags(page.read_text()) == []


PLACEHOLDER = re.compile(r"=(?:[A-Z]|…|\.\.\.)$")  # train.seed=N, train.max_epsilon=…: a value for the user to give


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_set_shown_is_a_setting_the_job_takes(page):
    refused = []
    for line in page.read_text().splitlines():  # the settings of one line are checked together (a pair that goes
        items = [m.group(1) or m.group(2)  # together: train.no_dp=true with train.epsilon=none)
                 for m in re.finditer(r"--set\s+(?:'([^']*)'|([a-z_]+\.[a-z_0-9]+=[^\s`),;]+))", line)]
        items = [i for i in items if not PLACEHOLDER.search(i)]
        try:
            if items:
                _check_setting(*items)
        except ValidationError as e:
            refused.append(f"{' '.join('--set ' + i for i in items)}: {e}")
    assert refused == []
