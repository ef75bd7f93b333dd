"""docker-compose.yml: the services it promises, in the right order, and every command it runs is
a real `kernelfleet` command (checked by running it with --help)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def load() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def cli_words(command: list[str]) -> list[str]:
    """The sub-command words of a `kernelfleet ...` command line (everything before the first option)."""
    assert command[0] == "kernelfleet", command
    words: list[str] = []
    for word in command[1:]:
        if word.startswith("-"):
            break
        words.append(word)
    return words


def test_services_and_their_order() -> None:
    services = load()["services"]
    assert {"postgres", "migrate", "coordinator"} <= set(services)
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["coordinator"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert cli_words(services["migrate"]["command"]) == ["db", "upgrade"]
    assert cli_words(services["coordinator"]["command"]) == ["serve"]
    for name in ("migrate", "coordinator"):
        env = services[name]["environment"]
        assert all(k.startswith("KERNELFLEET_") for k in env), env
        assert env["KERNELFLEET_DATABASE_URL"].startswith("postgresql://")
        assert "@postgres:5432/" in env["KERNELFLEET_DATABASE_URL"]
        assert services[name]["build"] == "."
    assert (ROOT / "Dockerfile").read_text().startswith("# ")
    assert "FROM python:3.11-slim" in (ROOT / "Dockerfile").read_text()


def test_every_command_is_a_real_cli_command() -> None:
    commands = [s["command"] for s in load()["services"].values() if s.get("command")]
    dockerfile_cmd = re.search(r"^CMD (\[.*\])$", (ROOT / "Dockerfile").read_text(), re.M)
    assert dockerfile_cmd is not None
    commands.append(yaml.safe_load(dockerfile_cmd.group(1)))
    assert len(commands) >= 3
    env = dict(os.environ, COLUMNS="200")
    for command in commands:
        words = cli_words(command)
        r = subprocess.run([sys.executable, "-m", "kernelfleet.worker.cli", *words, "--help"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, f"`kernelfleet {' '.join(words)}` is not a command: {r.stderr}"
        options = [w.split("=")[0] for w in command[1:] if w.startswith("--")]
        for option in options:
            assert option in r.stdout, f"`kernelfleet {' '.join(words)}` has no option {option}"
