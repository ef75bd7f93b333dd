"""docker-compose.yml: the services it promises, in the right order, every command it runs is a real
`kernelfleet` command (checked by running it with --help), and its load balancer's config
(deploy/nginx.conf, parsed with nginx's own parser, crossplane) agrees with its coordinators."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import crossplane
import yaml
from inproc import run_cli

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


def coordinators(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items()
            if s.get("command") and cli_words(s["command"]) == ["serve"]}


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_services_and_their_order() -> None:
    services = load()["services"]
    assert {"postgres", "migrate", "lb"} <= set(services)
    replicas = coordinators(services)
    assert len(replicas) >= 2, "two coordinator replicas behind the load balancer"
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert cli_words(services["migrate"]["command"]) == ["db", "upgrade"]
    for name, replica in replicas.items():
        assert replica["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert "healthcheck" in replica
        assert "ports" not in replica, f"{name}: only the load balancer is published"
        assert services["lb"]["depends_on"][name]["condition"] == "service_healthy"
    # replicas share nothing but the database: the same settings, no volumes
    envs = [r["environment"] for r in replicas.values()]
    assert all(env == envs[0] for env in envs)
    assert not any("volumes" in r for r in replicas.values())
    for name in ("migrate", *replicas):
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
    for command in commands:  # in-process (click's runner): the same command tree the entry point runs
        words = cli_words(command)
        r = run_cli(*words, "--help", env={"COLUMNS": "200"})
        assert r.exit_code == 0, f"`kernelfleet {' '.join(words)}` is not a command: {r.stderr}"
        options = [w.split("=")[0] for w in command[1:] if w.startswith("--")]
        for option in options:
            assert option in r.stdout, f"`kernelfleet {' '.join(words)}` has no option {option}"


def nginx_config() -> list[dict[str, Any]]:
    """The parsed directives of the config file the lb service mounts as nginx.conf."""
    lb = load()["services"]["lb"]
    assert lb["image"].startswith("nginx:")
    mounts = [v.split(":") for v in lb["volumes"]]
    (source,) = [src for src, dst, *_ in mounts if dst == "/etc/nginx/nginx.conf"]
    parsed = crossplane.parse(str(ROOT / source), single=True)
    assert parsed["status"] == "ok", parsed["errors"]
    return list(parsed["config"][0]["parsed"])


def directives(block: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Every directive called ``name`` in ``block`` and the blocks inside it."""
    found = []
    for d in block:
        if d["directive"] == name:
            found.append(d)
        found.extend(directives(d.get("block", []), name))
    return found


def test_load_balancer_and_coordinators_agree() -> None:
    services = load()["services"]
    replicas = coordinators(services)
    config = nginx_config()
    (upstream,) = directives(config, "upstream")
    servers = {d["args"][0] for d in directives(upstream["block"], "server")}
    assert servers == {f"{name}:{option(r['command'], '--port')}" for name, r in replicas.items()}
    (proxy_pass,) = directives(config, "proxy_pass")
    assert proxy_pass["args"] == [f"http://{upstream['args'][0]}"]
    (listen,) = directives(config, "listen")
    assert services["lb"]["ports"] == [f"8600:{listen['args'][0]}"]
    limits_agree(config)


def limits_agree(config: list[dict[str, Any]]) -> None:
    """The proxy lets through what a coordinator accepts, waits as long as a lease may, and never
    replays a POST on another replica (no "non_idempotent" retry)."""
    from kernelfleet.service.settings import Settings

    defaults = Settings(database_url="sqlite://")
    (body,) = directives(config, "client_max_body_size")
    assert body["args"] == [f"{defaults.max_body_bytes // 2**20}m"]
    (read_timeout,) = directives(config, "proxy_read_timeout")
    assert float(read_timeout["args"][0].removesuffix("s")) > defaults.lease_wait_max_seconds
    (next_upstream,) = directives(config, "proxy_next_upstream")
    assert "non_idempotent" not in next_upstream["args"]


def interpolations(value: Any) -> list[tuple[str, str, str]]:
    """Every ``${NAME<op>text}`` in the compose file's strings: (NAME, op, text); op is ':?', ':-' or ''."""
    if isinstance(value, dict):
        return [i for v in value.values() for i in interpolations(v)]
    if isinstance(value, list):
        return [i for v in value for i in interpolations(v)]
    if not isinstance(value, str):
        return []
    return [(m["name"], m["op"] or "", m["text"] or "")
            for m in re.finditer(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<text>[^}]*))?\}", value)]


def test_secrets_come_from_the_environment_and_the_public_url_is_passed() -> None:
    """No default passwords or tokens: compose refuses to start until each secret is set (``:?``); the
    coordinators get the public URL (the dashboard's Add a worker and pull commands name it), and
    deploy/env.example lists every variable compose requires."""
    data = load()
    found = interpolations(data)
    secrets = [(name, op) for name, op, _ in found if re.search(r"PASSWORD|TOKEN|SECRET", name)]
    assert {"POSTGRES_PASSWORD", "KERNELFLEET_ADMIN_TOKEN"} <= {name for name, _ in secrets}
    assert all(op == ":?" for _, op in secrets), f"a secret with a default or none required: {secrets}"
    for name, replica in coordinators(data["services"]).items():
        env = replica["environment"]
        assert interpolations(env.get("KERNELFLEET_PUBLIC_URL")) and all(
            op == ":?" for _, op, _ in interpolations(env["KERNELFLEET_PUBLIC_URL"])), name
    required = {name for name, op, _ in found if op == ":?"}
    example = (ROOT / "deploy" / "env.example").read_text()
    listed = set(re.findall(r"^(\w+)=", example, re.M))
    assert required <= listed, f"deploy/env.example lacks {sorted(required - listed)}"


def test_the_tls_example_agrees_with_the_coordinator() -> None:
    """deploy/nginx-tls.conf (README: Run a fleet): HTTPS on 443 with a certificate, plain HTTP only
    redirects, and the same limits as the compose balancer in front of one `kernelfleet serve` on the
    loopback, the address deploy/kernelfleet.service serves on."""
    parsed = crossplane.parse(str(ROOT / "deploy" / "nginx-tls.conf"), single=True,
                              check_ctx=False)  # a conf.d file: its directives live in nginx's http{}
    assert parsed["status"] == "ok", parsed["errors"]
    config = list(parsed["config"][0]["parsed"])
    listens = [d["args"] for d in directives(config, "listen")]
    assert ["443", "ssl"] in listens and ["80"] in listens
    assert directives(config, "ssl_certificate") and directives(config, "ssl_certificate_key")
    (upstream,) = directives(config, "upstream")
    (server,) = directives(upstream["block"], "server")
    unit = (ROOT / "deploy" / "kernelfleet.service").read_text()
    start = re.search(r"^ExecStart=(.*)$", unit, re.M)
    assert start is not None
    serve = start.group(1).split()
    assert server["args"][0] == f"{option(serve, '--host')}:{option(serve, '--port')}"
    assert "KERNELFLEET_PUBLIC_URL=https://" in unit
    limits_agree(config)
    headers = [d["args"] for d in directives(config, "proxy_set_header")]
    assert ["X-Forwarded-Proto", "$scheme"] in headers
