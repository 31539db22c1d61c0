"""Fuzz target of the hostname match (``router.hostname``) that every parsed ``:authority`` and SNI
reaches, seeded with real names and the edges of the authority's length bound.

The input is the name's bytes, decoded as the h2c reader and the ClientHello walker decode them
(ASCII, a bad byte replaced). It goes through two templates: the default one, and one whose
``stargate-0`` is a 253-octet name, so that the longest legal authority (260 characters with its
trailing dot and a 5-digit port) and one character more are both near every mutation.
"""

from __future__ import annotations

import random

from router import constants as c
from router.hostname import HostnameTemplate
from tests.fuzz.target import TEMPLATE, FuzzTarget, check, route_name

LONG_TEMPLATE = HostnameTemplate.parse("{pod_name}." + ".".join(["x" * 61] * 3) + "." + "y" * 56, "demo")
"""``stargate-0`` under it is the longest DNS name (253 octets)."""
LONGEST_NAME = LONG_TEMPLATE.hostname_for("stargate-0")


def run_authority(data: bytes) -> str:
    name = data.decode("ascii", errors="replace")
    outcomes = []
    for template in (TEMPLATE, LONG_TEMPLATE):
        pod = route_name(name, template)
        check(route_name(name, template) == pod, "a remembered name answers otherwise the second time")
        outcomes.append("pod" if pod is not None else "none")
    too_long = len(name) > c.MAX_AUTHORITY_LENGTH
    check(not too_long or outcomes == ["none", "none"], "an over-long name routed")
    return ("long-" if too_long else "") + "-".join(outcomes)


def authority_seeds() -> list[bytes]:
    names = [
        "stargate-0.stargate.external", "stargate-0.stargate.external:50071", "STARGATE-1.Stargate.External.:443",
        "stargate-0.stargate.external:65535", "stargate-0.stargate.external:650710",
        "stargate-0.stargate.external:" + "0" * 16_000, "a" * 63 + ".stargate.external.:12345",
        LONGEST_NAME, LONGEST_NAME + ".", LONGEST_NAME + ":65535", LONGEST_NAME + ".:65535",
        LONGEST_NAME + ".:065535", LONGEST_NAME + "x", "[::1]:50071", "10.0.0.1:50071", "",
        "stargate-0.stargate.external\x00:1", "stargate-0.stargate.external:\u0661",
    ]
    return [n.encode("utf-8") for n in names]


def mutate_authority(data: bytes, rng: random.Random) -> bytes | None:
    """Grow or cut the name around the length bound: port digits, dots, labels, a second colon."""
    name = bytearray(data)
    roll = rng.random()
    if roll < 0.3:
        name += b":" * (rng.random() < 0.5) + bytes(rng.choice(b"0123456789") for _ in range(rng.randint(1, 9)))
    elif roll < 0.5:
        name += b"." * rng.randint(1, 2)
    elif roll < 0.65:
        name[: rng.randint(0, len(name))] = b"x" * rng.randint(1, 63) + b"."
    elif roll < 0.8:
        target = c.MAX_AUTHORITY_LENGTH + rng.randint(-3, 3)
        name = name[:target] + b"9" * max(0, target - len(name))
    elif roll < 0.9:
        name = name.upper() if rng.random() < 0.5 else name.lower()
    else:
        name += bytes(name) * rng.randint(1, 3)
    return bytes(name)


AUTHORITY_DICTIONARY = (b":", b".", b":65535", b".:", b"stargate-0", b".stargate.external", b"0" * 6, b"\xff")

AUTHORITY_TARGETS = (
    FuzzTarget("authority", run_authority, (), authority_seeds, 20_000, AUTHORITY_DICTIONARY, mutate_authority),
)
