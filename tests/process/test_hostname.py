"""Hostname template: parse rules, a match table of hostile names, and a round-trip fuzz."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.constants import (
    DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE,
    HOSTNAME_CACHE_ENTRIES,
    MAX_AUTHORITY_LENGTH,
    MAX_HOSTNAME_LENGTH,
    MAX_PORT_DIGITS,
)
from router.hostname import HostnameTemplate, TemplateError, is_pod_label

DEFAULT = HostnameTemplate.parse(DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "stargate")


def test_parse_splits_around_pod_name() -> None:
    assert (DEFAULT.prefix, DEFAULT.suffix) == ("", ".stargate.external")


def test_parse_substitutes_namespace_on_both_sides() -> None:
    t = HostnameTemplate.parse("{namespace}-{pod_name}.{namespace}.svc", "prod")
    assert (t.prefix, t.suffix) == ("prod-", ".prod.svc")
    assert t.pod_name_for("prod-stargate-2.prod.svc") == "stargate-2"


def test_parse_lowercases_and_drops_a_trailing_dot() -> None:
    t = HostnameTemplate.parse("{pod_name}.Stargate.External.", "ns")
    assert t.suffix == ".stargate.external"
    assert t.pod_name_for("stargate-0.stargate.external.") == "stargate-0"


@pytest.mark.parametrize(
    "template",
    [
        "stargate.external",
        "{pod_name}.{pod_name}.external",
        "{pod}.stargate.external",
        "{pod_name}.{cluster}.external",
        "{pod_name!r}.stargate.external",
        "{pod_name:>10}.stargate.external",
        "{pod_name.x}.stargate.external",
        "{pod_name[0]}.stargate.external",
        "{pod_name}.stargate.external}",
        "{{pod_name}}.stargate.external",
        "{pod_name}.stärgate.external",
        "{}.stargate.external",
    ],
)
def test_parse_refuses(template: str) -> None:
    with pytest.raises(TemplateError):
        HostnameTemplate.parse(template, "ns")


def test_non_ascii_namespace_is_refused() -> None:
    with pytest.raises(TemplateError):
        HostnameTemplate.parse("{pod_name}.{namespace}", "nä")


@pytest.mark.parametrize(
    ("hostname", "pod"),
    [
        ("stargate-0.stargate.external", "stargate-0"),
        ("stargate-0.stargate.external:50071", "stargate-0"),
        ("stargate-0.stargate.external.", "stargate-0"),
        ("stargate-0.stargate.external.:443", "stargate-0"),
        ("STARGATE-0.Stargate.EXTERNAL", "stargate-0"),
        ("0.stargate.external", "0"),
        ("a" * 63 + ".stargate.external", "a" * 63),
        ("xn--bcher-kva.stargate.external", "xn--bcher-kva"),
        ("x.stargate-0.stargate.external", None),
        ("stargate-0.stargate.external.evil", None),
        ("stargate-0.stargate.externa", None),
        ("stargate-0stargate.external", None),
        (".stargate.external", None),
        ("stargate.external", None),
        ("", None),
        (":", None),
        ("stargate-0.stargate.external:", None),
        ("stargate-0.stargate.external:x1", None),
        ("stargate-0.stargate.external:1:2", None),
        ("stargate-0.stargate.external:65535", "stargate-0"),
        ("stargate-0.stargate.external:00001", "stargate-0"),
        ("stargate-0.stargate.external:650710", None),
        ("stargate-0.stargate.external.:000001", None),
        ("stargate-0.stargate.external:" + "0" * 16_000, None),
        ("stargate-0.stargate.external:\u0661", None),
        ("stargate-0.stargate.external..", None),
        ("-stargate.stargate.external", None),
        ("stargate-.stargate.external", None),
        ("stargate_0.stargate.external", None),
        ("a" * 64 + ".stargate.external", None),
        ("10.0.0.1", None),
        ("10.0.0.1:50071", None),
        ("[::1]:50071", None),
        ("[fe80::1].stargate.external", None),
        ("user@stargate-0.stargate.external", None),
        ("a@b.stargate.external", None),
        ("stargate\x00.stargate.external", None),
        ("stargate-0\x00.stargate.external", None),
        ("stärgate-0.stargate.external", None),
        ("stargate-\ufffd.stargate.external", None),
        ("stargate-0.stargate.external\n", None),
        (" stargate-0.stargate.external", None),
        ("stargate-0.stargate.external/", None),
        ("stargate-\u212a.stargate.external", None),  # Kelvin sign lowercases to ASCII "k"
        ("s" * 300 + ".stargate.external", None),
    ],
)
def test_pod_name_for(hostname: str, pod: str | None) -> None:
    assert DEFAULT.pod_name_for(hostname) == pod


def test_total_length_cap_applies_before_matching() -> None:
    t = HostnameTemplate.parse("{pod_name}." + "x" * 200 + ".y", "ns")
    assert t.pod_name_for("a" * 40 + t.suffix) == "a" * 40
    assert len("a" * 60 + t.suffix) > MAX_HOSTNAME_LENGTH
    assert t.pod_name_for("a" * 60 + t.suffix) is None


def test_bare_pod_name_template() -> None:
    t = HostnameTemplate.parse("{pod_name}", "ns")
    assert t.pod_name_for("stargate-0:50071") == "stargate-0"
    assert t.pod_name_for("stargate-0.stargate.external") is None


def test_hostname_for() -> None:
    assert DEFAULT.hostname_for("stargate-3") == "stargate-3.stargate.external"


def test_is_pod_label() -> None:
    assert is_pod_label("a-b-1")
    assert not is_pod_label("A")
    assert not is_pod_label("a" * 64)


_hostish = st.text(
    alphabet=st.sampled_from("abcxyzSTG019-._:@[]\x00\u00e4\u212a\ufffd"), max_size=80
).map(lambda s: s + ".stargate.external")


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=300), _hostish))
def test_fuzz_none_or_round_tripping_label(hostname: str) -> None:
    pod = DEFAULT.pod_name_for(hostname)
    if pod is not None:
        assert is_pod_label(pod)
        assert DEFAULT.pod_name_for(DEFAULT.hostname_for(pod)) == pod
        assert DEFAULT.hostname_for(pod) == hostname.lower().split(":")[0].removesuffix(".")


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True))
def test_fuzz_every_label_round_trips(pod: str) -> None:
    assert DEFAULT.pod_name_for(DEFAULT.hostname_for(pod)) == pod
    assert DEFAULT.pod_name_for(DEFAULT.hostname_for(pod).upper() + ":1") == pod


def test_remembered_names_answer_alike_stay_bounded_and_misses_are_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import router.hostname as hostname_module

    monkeypatch.setattr(hostname_module, "HOSTNAME_CACHE_ENTRIES", 4)
    template = HostnameTemplate.parse("{pod_name}.stargate.external", "demo")
    for _ in range(2):  # the second round answers from the table
        assert template.pod_name_for("Stargate-0.stargate.external:443") == "stargate-0"
        assert template.pod_name_for("x.stargate-0.stargate.external") is None
        assert template.pod_name_for("stargate-0.other.example") is None
    for i in range(10):
        assert template.pod_name_for(f"stargate-{i}.stargate.external") == f"stargate-{i}"
    assert 0 < len(template._names) <= 4
    assert all(template._names[name] == template._match(name) for name in template._names)
    assert template == HostnameTemplate.parse("{pod_name}.stargate.external", "demo")


LONG_TEMPLATE = HostnameTemplate.parse("{pod_name}." + ".".join(["x" * 61] * 3) + "." + "y" * 56, "ns")
"""``stargate-0`` under it is a 253-octet name, the longest there is."""
LONGEST_NAME = LONG_TEMPLATE.hostname_for("stargate-0")


def test_the_longest_legal_authority_names_its_pod_and_one_character_more_names_none() -> None:
    assert len(LONGEST_NAME) == MAX_HOSTNAME_LENGTH
    longest = LONGEST_NAME + ".:65535"
    assert len(longest) == MAX_AUTHORITY_LENGTH == MAX_HOSTNAME_LENGTH + 2 + MAX_PORT_DIGITS
    assert LONG_TEMPLATE.pod_name_for(longest) == "stargate-0"
    assert LONG_TEMPLATE.pod_name_for(LONGEST_NAME + ":65535") == "stargate-0"
    assert LONG_TEMPLATE.pod_name_for(LONGEST_NAME + ".:065535") is None
    assert LONG_TEMPLATE.pod_name_for(LONGEST_NAME + ":0" * 2) is None


_pod = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
_too_long = st.tuples(_pod, st.sampled_from(["", ".", ":", ".:", ":5"]), st.text(alphabet="0123456789.:xX-",
                      min_size=1, max_size=20_000))


@settings(max_examples=300, deadline=None)
@given(_too_long)
def test_fuzz_nothing_longer_than_an_authority_routes_or_is_remembered(parts: tuple[str, str, str]) -> None:
    """A routable name padded (port digits, dots, labels) past ``MAX_AUTHORITY_LENGTH`` names no pod,
    and the table never holds it; whatever routes is within the bound."""
    pod, joint, tail = parts
    template = HostnameTemplate.parse("{pod_name}.stargate.external", "demo")
    name = template.hostname_for(pod) + joint + tail
    routed = template.pod_name_for(name)
    if len(name) > MAX_AUTHORITY_LENGTH:
        assert routed is None and name not in template._names
    assert all(len(known) <= MAX_AUTHORITY_LENGTH for known in template._names)
    if routed is not None:
        assert routed == pod and len(name) <= len(template.hostname_for(pod)) + 2 + MAX_PORT_DIGITS


def test_the_table_of_names_holds_at_most_its_documented_two_mib() -> None:
    """The worst case: every entry a name of the longest kind with a port, each naming its own
    63-character pod (``HOSTNAME_CACHE_ENTRIES``: "<= ~2 MiB")."""
    template = HostnameTemplate.parse("{pod_name}." + "s" * (MAX_HOSTNAME_LENGTH - 63 - 3) + ".x", "ns")
    names = [template.hostname_for(f"p{i:062d}") + f".:{i % 100_000:05d}" for i in range(HOSTNAME_CACHE_ENTRIES)]
    assert {len(n) for n in names} == {MAX_AUTHORITY_LENGTH}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for name in names:
            assert template.pod_name_for(name) is not None
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(template._names) == HOSTNAME_CACHE_ENTRIES
    # The names themselves were allocated before: what the table adds is its slots and the pod names;
    # with the keys (49 bytes of header + their characters each) that is the table's whole cost.
    keys = sum(49 + len(n) for n in names)
    assert held + keys <= 2 * 1024 * 1024, (held, keys)
