"""The quinn test peer (``tests/support/quinn_peer/``, Rust): built here, run by the tests, as a
client endpoint or as a QUIC-LB pod (``start_quinn_pod``).

It is built with cargo from Debian's vendored crates (``librust-quinn-dev``, ``librust-tokio-dev``:
``.cargo/config.toml`` points cargo at ``/usr/share/cargo/registry``, offline), once per source
version, into the temporary directory, as ``bench.udp_peers`` builds its C peer. ``.ci/run``
installs the packages; where cargo or the crates are missing, ``build`` says why and the
tests that need quinn skip with that reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PROJECT = Path(__file__).with_name("quinn_peer")
SOURCES = ("Cargo.toml", "Cargo.lock", ".cargo/config.toml", "src/main.rs", "src/pod.rs")
BUILD_TIMEOUT_S = 600.0
"""A first build compiles quinn, rustls, ring and tokio (~25 s on two cores); later runs reuse it."""
VENDORED = Path("/usr/share/cargo/registry")
POD_START_TIMEOUT_S = 10.0


def _digest() -> str:
    sha = hashlib.sha256()
    for name in SOURCES:
        sha.update(name.encode() + b"\0" + (PROJECT / name).read_bytes())
    return sha.hexdigest()[:12]


def build() -> tuple[Path | None, str]:
    """(the peer's binary, "") once built, or (None, why not)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        return None, "cargo is not installed"
    if not (VENDORED / "quinn-0.9.3").is_dir():
        return None, f"Debian's quinn crates are not in {VENDORED} (librust-quinn-dev, librust-tokio-dev)"
    binary = Path(tempfile.gettempdir()) / f"stargate-quinn_peer-{_digest()}"
    if binary.exists():
        return binary, ""
    target = Path(tempfile.gettempdir()) / "stargate-quinn_peer-target"
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    done = subprocess.run([cargo, "build", "--offline", "--locked", "--quiet"], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        return None, f"cargo build failed: {done.stderr.strip()[-2000:]}"
    partial = binary.with_suffix(".partial")
    shutil.copy2(target / "debug" / "quinn_peer", partial)
    partial.rename(binary)
    return binary, ""


async def start_quinn_pod(
    binary: Path, host: str, cert_der: Path, key_der: Path, pod: str, server_id: bytes
) -> tuple[asyncio.subprocess.Process, int]:
    """The peer as a QUIC-LB pod (``quinn_peer pod``) on ``host``: (its process, its UDP port).
    ``cert_der`` / ``key_der``: the server certificate and its PKCS#8 key, DER."""
    proc = await asyncio.create_subprocess_exec(
        str(binary), "pod", f"{host}:0", str(cert_der), str(key_der), pod, server_id.hex(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), POD_START_TIMEOUT_S)
    if not line.startswith(b"listening "):
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"quinn pod did not start: {line!r}")
    return proc, int(line.split()[1])
