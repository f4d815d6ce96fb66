"""PII redaction: planted addresses in real-looking text (every public one replaced, no private, loopback,
documentation or multicast address and no version string changed), the switches and placeholders, ``auto`` by
source URI, the config loader, and the per-source counts through the clean stage."""

from __future__ import annotations

import ipaddress
import random
from collections import Counter

import pytest

from pipeline.clean.config import CleanConfig, PiiConfig, QualityConfig
from pipeline.clean.pii import applies, find_ipv4, redact, redact_document
from pipeline.clean.stage import clean_batch, clean_batch_by_source, source_clean_configs
from pipeline.config import ConfigError
from pipeline.corpus_config import load_corpus_config
from pipeline.records import Record
from pipeline.sources import SourceConfig

ON = PiiConfig(enabled=True)
PUBLIC_V4 = ["8.8.8.8", "93.184.216.34", "8.8.4.4", "151.101.1.69", "1.1.1.1", "203.0.114.9", "100.128.0.1"]
PUBLIC_V6 = [
    "2606:4700::1111",
    "2001:4860:4860::8888",
    "2a03:2880:f10c:83:face:b00c:0:25de",
    "::ffff:8.8.8.8",
]
PUBLIC_EMAILS = ["jane.doe@gmail.com", "j_smith+news@mail.example.co.uk", "ops-team@corp.io", "a1@b-c.de"]
NOT_PUBLIC = [
    "10.0.0.1",
    "10.255.1.2",
    "192.168.1.20",
    "172.16.0.5",
    "172.20.3.4",
    "172.31.255.254",
    "127.0.0.1",
    "127.1.2.3",
    "169.254.10.1",
    "100.64.0.1",
    "100.127.255.1",
    "192.0.2.44",
    "198.51.100.7",
    "203.0.113.200",
    "0.0.0.0",
    "255.255.255.255",
    "224.0.0.251",
    "240.1.2.3",
    "::1",
    "fe80::1",
    "fe80::a00:27ff:fe4e:66a1",
    "fd00::42",
    "fc00:1:2::3",
    "2001:db8::5",
    "ff02::fb",
    "::",
    "::ffff:10.1.2.3",
]
RESERVED_EMAILS = ["user@example.com", "admin@mail.example.org", "x@test", "root@host.invalid", "me@a.test"]
VERSIONS = [  # marked as versions by their own form
    "1.2.3.4-1",
    "v1.2.3.4",
    "1.2.3.4.5",
    "python3.11.2.4",
    "1.2.3.4+dfsg",
    "1.2.3.4~rc1",
    "libfoo-1.2.3.4",
    "1:2.38.1.5",
    "2.38.1.5.dev0",
    "1.2.3.4rc1",
]
VERSION_CONTEXTS = [  # a bare quad, marked as a version by what surrounds it
    "glib2.0 (2.38.1.5) unstable; urgency=medium",
    "New upstream release 2.38.1.5.",
    "Version: 2.38.1.5",
    "Standards-Version: 4.6.1.0",
    "Depends: libglib (>= 2.38.1.5)",
    "upgrade to 2.38.1.5",
    "bumped to 2.38.1.5",
    "see section 5.7.1.1",
    "a vote under \u00a76.3.1.4 or \u00a7 6.3.1.5",
    "Git 2.38.1 was followed by Git 2.38.1.5",
]
PROSE = (
    "The quick survey of the server logs showed nothing unusual for most of the week. Each morning the "
    "team checked the dashboard, compared the numbers with the previous day and wrote a short note."
)


def page(addresses: list[str], seed: int = 0) -> str:
    """Real-looking text: prose and log lines, each address in one of the contexts addresses appear in."""
    rng = random.Random(seed)
    contexts = ["connect to {}", "from {}:443", "[{}]", "ip={},", "<{}>", "({})", "{}.", "host {} port 22"]
    lines = [PROSE]
    for address in addresses:
        lines.append(f"{rng.choice(contexts).format(address)} {PROSE[: rng.randint(20, 120)]}")
    return "\n".join(lines)


def test_every_public_address_in_real_looking_text_is_replaced():
    text = page(PUBLIC_V4 + PUBLIC_V6 + PUBLIC_EMAILS)
    out, emails, ips = redact(text, ON)
    assert (emails, ips) == (len(PUBLIC_EMAILS), len(PUBLIC_V4) + len(PUBLIC_V6))
    for address in PUBLIC_V4 + PUBLIC_V6 + PUBLIC_EMAILS:
        assert address not in out
    assert out.count("192.0.2.1") == len(PUBLIC_V4) and out.count("2001:db8::1") == len(PUBLIC_V6)
    assert out.count("email@example.com") == len(PUBLIC_EMAILS)
    assert out.count(PROSE) == 1  # the prose around them is untouched


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_private_loopback_link_local_documentation_shared_and_multicast_are_kept(address):
    assert not ipaddress.ip_address(address).is_global or ipaddress.ip_address(address).is_multicast
    text = page([address] * 3)
    assert redact(text, ON) == (text, 0, 0)


@pytest.mark.parametrize("address", RESERVED_EMAILS)
def test_emails_at_reserved_example_domains_are_kept(address):
    text = page([address])
    assert redact(text, ON) == (text, 0, 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_version_strings_are_not_addresses(version):
    text = f"We built {version} today; see {version} and ({version}) below, or {version}."
    assert redact(text, ON) == (text, 0, 0)


@pytest.mark.parametrize("line", VERSION_CONTEXTS)
def test_quads_in_version_contexts_are_not_addresses(line):
    text = f"{PROSE}\n{line}\n{PROSE}"
    assert redact(text, ON) == (text, 0, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("connect to 8.8.8.8", "connect to 192.0.2.1"),
        ("from 93.184.216.34:443 to", "from 192.0.2.1:443 to"),
        ("Trying [2606:4700::1111]:443...", "Trying [2001:db8::1]:443..."),
        ("ip=8.8.4.4, port=53", "ip=192.0.2.1, port=53"),
        ("the resolver at 1.1.1.1.", "the resolver at 192.0.2.1."),
        ("...8.8.8.8", "...192.0.2.1"),
        ("range 8.8.8.0-8.8.8.255 is", "range 192.0.2.1-192.0.2.1 is"),
        ("Mail <jane.doe@gmail.com>, please", "Mail <email@example.com>, please"),
        ("mailto:ops@corp.io.", "mailto:email@example.com."),
        ("(2.38.1.5)", "(192.0.2.1)"),  # outside a changelog heading, a bare quad is an address
        ("Update [8.8.8.8] and version. 8.8.4.4", "Update [192.0.2.1] and version. 192.0.2.1"),  # clause ends
        (  # lines of the bundled sample corpus
            "64 bytes from klecker-misc.debian.org (130.89.148.77): icmp_seq=1 ttl=50",
            "64 bytes from klecker-misc.debian.org (192.0.2.1): icmp_seq=1 ttl=50",
        ),
        (
            "PING www.debian.org(mirror-csail.debian.org (2603:400a:ffff:bb8::801f:3e)) 1452 data bytes",
            "PING www.debian.org(mirror-csail.debian.org (2001:db8::1)) 1452 data bytes",
        ),
        ("smtp99.hostname.dom has address 123.234.123.89", "smtp99.hostname.dom has address 192.0.2.1"),
        ("from 2a03:2880:f10c:83:face:b00c:0:25de:443 on", "from 2001:db8::1:443 on"),  # a port, no brackets
    ],
)
def test_known_answers(text, expected):
    assert redact(text, ON)[0] == expected


def test_a_debian_changelog_keeps_its_versions_and_loses_its_addresses():
    changelog = (
        "glib2.0 (2.38.1.5-1) unstable; urgency=medium\n\n"
        "  * New upstream release 2.38.1.5.\n"
        "  * Bump Standards-Version: 4.6.1.0 (no changes).\n"
        "  * Build-Depends: libffi-dev (>= 3.3.0.1), python3.11.2.4 scripts.\n"
        "  * Upgrade to 1.2.3.4, then see section 5.7.1.1 of the spec.\n"
        "  * Tests no longer reach 8.8.8.8 (closes: #1234).\n\n"
        " -- Jane Maintainer <jane@debian.org>  Mon, 01 Jan 2024 12:34:56 +0000\n\n"
        "glib2.0 (1:2.38.1.4) unstable; urgency=low\n\n"
        "  * Git 1.7.8 and Git 1.7.8.4 are versions of one family.\n"
    )
    out, emails, ips = redact(changelog, ON)
    assert (emails, ips) == (1, 1)
    assert out == changelog.replace("jane@debian.org", "email@example.com").replace("8.8.8.8", "192.0.2.1")


def test_every_kept_quad_names_its_guard():
    text = "1.2.3.4.5 v1.2.3.4 1.2.3.4-1 libx-1.2.3.4 999.1.2.3 10.0.0.1 version 2.3.4.5 (>= 3.4.5.6) 8.8.8.8"
    guards = [f.guard for f in find_ipv4(text)]
    assert guards == [
        "longer_dotted",
        "attached",
        "version_suffix",
        "version_prefix",
        "invalid",
        "not_public",
        "version_word",
        "version_constraint",
        None,
    ]


def test_switches_and_placeholders():
    text = "write to jane.doe@gmail.com or connect to 8.8.8.8 or [2606:4700::1111]"
    assert redact(text, PiiConfig(enabled=True, emails=False))[0] == (
        "write to jane.doe@gmail.com or connect to 192.0.2.1 or [2001:db8::1]"
    )
    assert redact(text, PiiConfig(enabled=True, ips=False)) == (
        "write to email@example.com or connect to 8.8.8.8 or [2606:4700::1111]",
        1,
        0,
    )
    dolma = PiiConfig(
        enabled=True,
        email_placeholder="|||EMAIL_ADDRESS|||",
        ip_placeholder="|||IP_ADDRESS|||",
        ipv6_placeholder="|||IP_ADDRESS|||",
    )
    assert redact(text, dolma)[0] == (
        "write to |||EMAIL_ADDRESS||| or connect to |||IP_ADDRESS||| or [|||IP_ADDRESS|||]"
    )
    assert redact(text, PiiConfig(enabled=True, ip_placeholder=""))[0].endswith(
        "connect to  or [2001:db8::1]"
    )
    assert redact_document(text, "x.warc.gz", "{}", PiiConfig(enabled=False), Counter()) == text


def test_a_second_pass_changes_nothing():
    once, _, _ = redact(page(PUBLIC_V4 + PUBLIC_V6 + PUBLIC_EMAILS), ON)
    assert redact(once, ON) == (once, 0, 0)


@pytest.mark.parametrize(
    ("uri", "web"),
    [
        ("s3://commoncrawl/crawl/CC-MAIN-0001.warc.gz", True),
        ("file:///data/CC-MAIN-0001.WET.GZ", True),
        ("/data/a.warc", True),
        ("/data/a.wet", True),
        ("/site/index.html", True),
        ("/site/index.htm", True),
        ("file:///data/docs.jsonl", False),
        ("/data/docs.jsonl.zst", False),
        ("/data/changelog.txt", False),
        ("/data/a.parquet", False),
    ],
)
def test_auto_redacts_web_inputs_only(uri, web):
    assert applies(PiiConfig(), uri) is web
    assert applies(PiiConfig(enabled=True), uri) and not applies(PiiConfig(enabled=False), uri)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match=r"PiiConfig\.enabled"):
        PiiConfig(enabled="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"PiiConfig\.ips"):
        PiiConfig(ips="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"PiiConfig\.email_placeholder"):
        PiiConfig(email_placeholder="a\nb")


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("false", False), ("auto", "auto")])
def test_the_loader_reads_enabled_from_yaml_and_set(tmp_path, value, expected):
    path = tmp_path / "corpus.yaml"
    path.write_text(f"clean:\n  pii:\n    enabled: {value}\n    ip_placeholder: '|||IP_ADDRESS|||'\n")
    cfg = load_corpus_config(path)
    assert cfg.clean.pii.enabled == expected and cfg.clean.pii.ip_placeholder == "|||IP_ADDRESS|||"
    from_set = load_corpus_config(
        None, overrides={"clean.pii.enabled": {"true": True, "false": False}.get(value, value)}
    )
    assert from_set.clean.pii.enabled == expected
    assert load_corpus_config(None).clean.pii == PiiConfig()


def test_the_loader_names_the_field_of_a_bad_value(tmp_path):
    path = tmp_path / "corpus.yaml"
    path.write_text("clean:\n  pii:\n    enabled: sometimes\n")
    with pytest.raises(ConfigError, match=r"clean\.pii\.enabled"):
        load_corpus_config(path)


# ---------------------------------------------------------------- through the clean stage

NO_QUALITY = QualityConfig(enabled=False)


def doc(i: int, source: str, uri: str, text: str) -> Record:
    return Record(f"{uri}#L{i}", text, uri, f'{{"source_name": "{source}", "source_entry": {i % 2}}}')


def test_clean_batch_counts_replacements_per_source_and_bytes_out_counts_redacted_text():
    records = [
        doc(0, "web", "s3://cc/a.warc.gz", f"{PROSE} Write to jane.doe@gmail.com or ops@corp.io."),
        doc(2, "web", "s3://cc/a.warc.gz", f"{PROSE} Served from 93.184.216.34 and [2606:4700::1111]."),
        doc(4, "forum", "/crawl/b.wet", f"{PROSE} My box is 8.8.8.8, mail me at me@home.net."),
        doc(6, "code", "/src/c.jsonl", f"{PROSE} Maintainer: dev@project.org, tested against 8.8.8.8."),
    ]
    out, stats = clean_batch(records, CleanConfig(quality=NO_QUALITY))
    assert [r.id for r in out] == [r.id for r in records]
    assert "jane.doe@gmail.com" not in out[0].text and "93.184.216.34" not in out[1].text
    assert out[3].text == records[3].text  # auto: a .jsonl source is left alone
    extra = stats.extra
    assert (extra["pii.email"], extra["pii.ip"]) == (3, 3)
    assert (extra["pii.email.web"], extra["pii.ip.web"]) == (2, 2)
    assert (extra["pii.email.forum"], extra["pii.ip.forum"]) == (1, 1)
    assert "pii.email.code" not in extra and "pii.ip.code" not in extra
    assert stats.bytes_out == sum(len(r.text.encode()) for r in out)
    assert not stats.dropped


def test_dropped_documents_are_not_redacted_or_counted():
    records = [
        doc(0, "web", "a.warc.gz", "8.8.8.8 me@home.net"),
        doc(2, "web", "a.warc.gz", PROSE + " 1.1.1.1"),
    ]
    out, stats = clean_batch(records, CleanConfig(quality=QualityConfig(min_chars=100, min_words=None)))
    assert [r.id for r in out] == [records[1].id] and stats.dropped == Counter({"too_short_chars": 1})
    assert stats.extra["pii.ip"] == 1 and stats.extra["pii.email"] == 0


def test_clean_batch_by_source_counts_each_source_with_its_own_config():
    sources = [
        SourceConfig(name="web", inputs=("s3://cc/",)),
        SourceConfig(name="code", inputs=("/src/",)),
    ]
    cfg = CleanConfig(quality=NO_QUALITY, pii=PiiConfig(enabled=True))
    per_source = source_clean_configs(cfg, sources)
    records = [
        doc(0, "web", "s3://cc/a.jsonl", f"{PROSE} from 93.184.216.34 and jane@gmail.com"),
        doc(1, "code", "/src/c.jsonl", f"{PROSE} from 8.8.8.8"),
        doc(2, "web", "s3://cc/a.jsonl", f"{PROSE} [2606:4700::1111]"),
    ]
    out, stats = clean_batch_by_source(records, cfg, per_source=per_source)
    assert [r.id for r in out] == [r.id for r in records]
    assert (stats.extra["pii.ip"], stats.extra["pii.email"]) == (3, 1)
    assert (stats.extra["pii.ip.web"], stats.extra["pii.ip.code"], stats.extra["pii.email.web"]) == (2, 1, 1)
    assert stats.bytes_out == sum(len(r.text.encode()) for r in out)
