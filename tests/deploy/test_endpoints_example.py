"""deploy/examples/endpoints.yaml: what a user copies to route their own pods.

Read with discovery's own loader and rules (the router's ``--endpoints-file`` path), kept out
of the kustomization, and the README's "Route your own pods" command is a valid config.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from discovery.file_source import load_endpoints_file
from discovery.settings import DiscoverySettings
from discovery.targets import Target
from router import constants as c
from router.config import config_from_args
from tests.support.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
EXAMPLE = DEPLOY / "examples" / "endpoints.yaml"
README_SECTION = "## Route your own pods"
NAMESPACE = "stargate"
"""The namespace the README's command passes as --target-namespace."""


def readme_command() -> list[str]:
    """The ``stargate-router ...`` line of the README section, split as a shell would."""
    section = (ROOT / "README.md").read_text().partition(README_SECTION)[2].partition("\n## ")[0]
    [line] = [ln for ln in section.splitlines() if ln.startswith("stargate-router ")]
    return shlex.split(line)


def test_example_yields_two_pods_with_grpc_and_quic_ports() -> None:
    load = load_endpoints_file(EXAMPLE, DiscoverySettings(
        NAMESPACE, c.DEFAULT_TARGET_SERVICE_NAME, c.DEFAULT_GRPC_PORT_NAME, c.DEFAULT_QUIC_PORT_NAME,
    ))
    assert load.error is None and load.snapshot is not None
    assert sorted(load.snapshot, key=lambda t: t.pod_name) == [
        Target("stargate-0", "127.0.0.2", 50051, 50052),
        Target("stargate-1", "127.0.0.3", 50051, 50052),
    ]


def test_readme_command_is_a_valid_config_on_the_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the command is given from the repository root
    argv = readme_command()
    assert argv[0] == "stargate-router"
    config = config_from_args(argv[1:], environ={})
    assert config.endpoints_file is not None and config.endpoints_file.resolve() == EXAMPLE
    assert config.target_namespace == NAMESPACE


def test_example_is_not_part_of_the_kustomization() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    listed = [*kustomization["resources"],
              *(f for gen in kustomization.get("configMapGenerator", []) for f in gen["files"])]
    assert not [entry for entry in listed if entry.startswith("examples")]


def test_kustomize_build_still_works_and_renders_no_example() -> None:
    kinds = {d["kind"] for d in render(DEPLOY)}
    assert "Deployment" in kinds and not kinds & {"EndpointSlice", "Gateway"}
