"""Where the Kubernetes client's configuration comes from: one resolution for the router and ``check``.

``--kubeconfig`` first; else the in-cluster service account when the Pod's environment says we
run in a cluster; else ``KUBECONFIG`` / ``~/.kube/config``, as kubectl does. Always on a fresh
``Configuration``, never the client library's process-wide default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every Pod: its presence selects the in-cluster service-account config."""


def config_source(kubeconfig: Path | None) -> str:
    """Names, for error messages, where ``load_configuration`` will read from."""
    if kubeconfig is not None:
        return f"--kubeconfig {kubeconfig}"
    if os.environ.get(IN_CLUSTER_ENV):
        return "in-cluster config"
    return f"kubeconfig {KUBE_CONFIG_DEFAULT_LOCATION} (KUBECONFIG or ~/.kube/config)"


def default_kubeconfig_missing(kubeconfig: Path | None) -> bool:
    """True when resolution falls through to ``KUBECONFIG`` / ``~/.kube/config`` and no such file exists."""
    if kubeconfig is not None or os.environ.get(IN_CLUSTER_ENV):
        return False
    paths = KUBE_CONFIG_DEFAULT_LOCATION.split(os.pathsep)  # as the client splits it
    return not any(path and os.path.exists(os.path.expanduser(path)) for path in paths)


async def load_configuration(kubeconfig: Path | None) -> Any:
    """A fresh ``client.Configuration`` loaded from ``config_source(kubeconfig)``; raises the client's errors."""
    cfg = client.Configuration()
    if kubeconfig is not None:
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg, persist_config=False)
    elif os.environ.get(IN_CLUSTER_ENV):
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(client_configuration=cfg, persist_config=False)
    return cfg
