"""PII redaction: email addresses and publicly routable IP addresses replaced by placeholders (``clean.pii``).

**What is redacted.** Email addresses (``local@domain.tld``: an ASCII local part of up to 64 characters that
neither starts nor ends with ``.``, a domain whose last label is 2-63 letters) and IP addresses, IPv4 (dotted
quads) and IPv6 (every text form the stdlib ``ipaddress`` parses, an embedded IPv4 tail included), that are
publicly routable: ``ipaddress``'s ``is_global`` (the IANA special-purpose registries: it leaves out the
private 10/8, 172.16/12, 192.168/16 and fc00::/7, loopback, link-local, reserved, unspecified, documentation
192.0.2/24, 198.51.100/24, 203.0.113/24 and 2001:db8::/32, and shared 100.64/10 ranges) and not multicast,
which ``is_global`` lets through (224.0.0.251 is mDNS on every LAN). An IPv4-mapped IPv6 address
(``::ffff:8.8.8.8``) is judged by its IPv4 address; any other IPv6 address must lie in 2000::/3, the only
block IANA allocates global unicast from, and have two groups or more, so ``b::c`` or ``dead::beef`` (valid
IPv6 text) and the ``2000::`` of ``Oct 1 2000::`` are not taken for one.

**What is not.** Private and special-purpose addresses (they name no one's machine on the internet); emails at
the domains reserved for examples (``example.com/.net/.org`` and their subdomains, the ``.example``,
``.invalid``, ``.localhost`` and ``.test`` TLDs: RFC 2606, RFC 6761); obfuscated addresses (``user at host dot
org``); phone numbers, names and street addresses (no regex finds them without many false positives).

**When.** ``enabled: auto`` (the default) redacts the documents of web inputs only (the source URI ends in one
of :data:`WEB_SUFFIXES`): code, documentation and changelogs carry maintainers' addresses on purpose, as
attribution, and version strings that look like IPs. ``true``/``false`` redact every document / none.

**Placeholders.** ``email@example.com`` (datatrove's, so FineWeb's, first replacement: an RFC 2606 domain that
names no one and keeps the shape of the text), ``192.0.2.1`` and ``2001:db8::1`` (the documentation ranges of
RFC 5737 and RFC 3849; datatrove's IP replacements are public addresses that happened not to answer a ping,
which may be someone's later). A placeholder is itself never redacted, so a second pass changes nothing.
Dolma's ``|||EMAIL_ADDRESS|||`` / ``|||IP_ADDRESS|||`` are a config value away.

**False-positive guards.** A dotted quad that parses as a public address is still left alone, under the
guard's name, when it is part of a longer dotted token (``longer_dotted``: ``1.2.3.4.5``); a letter, digit or
``_`` touches it (``attached``: ``v1.2.3.4``, ``python3.11.2.4``, ``1.2.3.4rc1``); a ``-``/``+``/``~`` suffix
follows (``version_suffix``: ``1.2.3.4-1``, ``1.2.3.4+dfsg``) or a ``name-`` prefix precedes
(``version_prefix``: ``libfoo-1.2.3.4``), unless the other side is an address too (``8.8.8.0-8.8.8.255``); an
epoch precedes (``epoch``: ``1:2.38.1.5``); it is the version of a Debian changelog heading
(``changelog_heading``: ``pkg (2.38.1.5) unstable; urgency=low``); a version constraint precedes
(``version_constraint``: ``(>= 2.38.1.5)``); the word right before it in the same clause is a version word,
or a version word and ``to``/``from``/``of``/``is``/``was`` (``version_word``: ``New upstream release
2.38.1.5``, ``Standards-Version: 4.6.1.0``, ``upgrade to 2.38.1.5``) or a section word or sign (``section_word``:
``section 5.7.1.1``, ``§6.3.1.4``); or the document writes its first three parts alone (``version_family``: ``Git 1.7.8``
beside ``Git 1.7.8.4``). A bracket, ``<``, ``=`` or punctuation between the word and the quad ends the clause,
so ``Update [8.8.8.8]`` and ``version. 8.8.8.8`` are replaced. :func:`find_ipv4` and :func:`find_ipv6` report
every candidate with its guard; ``tests/bench/bench_pii.py`` measures the false-positive and miss rates on
this machine's changelogs with them (about 1.4 false replacements per MB of Debian changelogs, the worst case;
99.6% of public addresses planted at random into that text replaced, the rest planted right after a version
word).

**Speed.** Every scan starts from a literal character (``@``, the ``.`` of ``.d.d.d``, the ``:`` of ``XXXX:``
or ``::``), which the regex engine finds at memchr speed, and Python looks only at what it finds: a document
without ``@`` is never scanned for emails, one without ``.d.d.d`` or ``:`` never looked at for addresses.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Iterator
from typing import NamedTuple

from pipeline.clean.config import PiiConfig
from pipeline.sources import provenance

WEB_SUFFIXES = (".warc", ".warc.gz", ".wet", ".wet.gz", ".arc", ".arc.gz", ".html", ".htm")
# Matched against "@domain" in lower case: the RFC 2606 / RFC 6761 names, which belong to no one.
RESERVED_EMAIL_SUFFIXES = tuple(
    f"{sep}{name}"
    for name in ("example", "invalid", "localhost", "test", "example.com", "example.net", "example.org")
    for sep in "@."
)
# A dotted quad right after one of these words is a version or a section number, not an address.
VERSION_WORDS = frozenset(
    {
        *("version", "versions", "ver", "v", "release", "releases", "released", "releasing", "snapshot"),
        *("bump", "bumps", "bumped", "update", "updates", "updated", "upgrade", "upgrades", "upgraded"),
        *("tag", "tagged", "revision", "rev", "policy", "standard", "standards"),  # "Debian Policy 4.6.1.0"
    }
)
SECTION_WORDS = frozenset(
    {
        "section",
        "sections",
        "sec",
        "chapter",
        "clause",
        "paragraph",
        "appendix",
        "table",
        "figure",
        "fig",
        "step",
    }
)
CONNECTORS = frozenset({"to", "from", "is", "was", "of"})  # "upgrade to 1.2.3.4", "version is 1.2.3.4"
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")

_AT_DOMAIN = re.compile(
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}(?![A-Za-z0-9-])"
)
_LOCAL_REVERSED = re.compile(r"[A-Za-z0-9_%+-][A-Za-z0-9._%+-]{0,63}")  # read backwards from the '@'
_V4_HIT = re.compile(r"\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]")  # '.' first: the engine skips to it at memchr speed
_V4_TOKEN = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_DOTTED_RUN = re.compile(r"[0-9A-Za-z.]*")
# ':' first; a global address starts with a group of 2000::/3 (``2606:``), an IPv4-mapped one with "::"
_V6_HIT = re.compile(r":(?:(?<=[23][0-9A-Fa-f]{3}:)|:)")
_V6_TOKEN = re.compile(r"[0-9A-Fa-f:.]+")
_QUAD = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")
_QUAD_BEFORE = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\Z")
_EPOCH_BEFORE = re.compile(r"(?:^|[\s(])[0-9]{1,3}:\Z")
_CONSTRAINT_BEFORE = re.compile(r"(?:[<>=!~][=<>]|\(=)\s*\Z")
_HEADING = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~-]* \(([^()\s]+)\)[^;\n]*; *urgency=", re.IGNORECASE)
_WORDS_BEFORE = re.compile(r"([A-Za-z]+):?[ \t]+(?:([A-Za-z]+):?[ \t]+)?\Z")  # one clause: no punctuation

_HEX = frozenset("0123456789abcdefABCDEF:")


class Found(NamedTuple):  # a tuple: made once per '@' of a changelog, where a dataclass costs 3x the scan
    """One candidate: ``text[start:end]`` is an ``email``, ``ipv4`` or ``ipv6`` address; ``guard`` names the
    reason it is left alone (``None``: it is redacted)."""

    start: int
    end: int
    kind: str
    guard: str | None


def applies(cfg: PiiConfig, source_uri: str) -> bool:
    """Whether ``cfg`` redacts a document of ``source_uri`` ("auto": web inputs only)."""
    if cfg.enabled == "auto":
        return source_uri.lower().endswith(WEB_SUFFIXES)
    return bool(cfg.enabled)


# ---------------------------------------------------------------- emails


def find_emails(text: str) -> Iterator[Found]:
    """Every email address of ``text``, in order; those at a reserved example domain are guarded. The local
    part is read backwards from the '@' through a reversed window, so each '@' costs at most 64 characters;
    it neither starts nor ends with a '.'."""
    for domain in _AT_DOMAIN.finditer(text):
        at = domain.start()
        local = _LOCAL_REVERSED.match(text[max(0, at - 64) : at][::-1])
        if local is not None:
            reserved = domain.group().lower().endswith(RESERVED_EMAIL_SUFFIXES)
            yield Found(
                at - len(local.group().rstrip(".")),
                domain.end(),
                "email",
                "reserved_domain" if reserved else None,
            )


# ---------------------------------------------------------------- IPv4


def find_ipv4(text: str) -> Iterator[Found]:
    """Every dotted quad of ``text`` that could be an IPv4 address, in order, with the guard that keeps it
    (``invalid``: an octet over 255 or with a leading zero; ``not_public``: not ``is_global``; the
    false-positive guards of the module docstring) or ``None`` (redacted). A longer dotted token is one
    candidate."""
    pos = 0
    family: dict[str, bool] = {}  # a.b.c -> whether the document writes it alone (a version)
    while (hit := _V4_HIT.search(text, pos)) is not None:
        dot = start = hit.start()
        while start > 0 and "0" <= text[start - 1] <= "9" and dot - start < 8:
            start -= 1
        if start == dot:  # no digit before the dot: look again one character on (``...8.8.8.8``)
            pos = dot + 1
            continue
        token = _V4_TOKEN.match(text, start)
        if token is None:  # cannot happen: digits, then the hit
            pos = dot + 1
            continue
        end = token.end()
        run = _DOTTED_RUN.match(text, end)
        pos = max(run.end() if run else 0, end)
        guard = _ipv4_guard(text, start, end)
        if guard is None:
            triple = text[start:end].rsplit(".", 1)[0]
            if triple not in family:
                family[triple] = _written_alone(text, triple)
            guard = "version_family" if family[triple] else None
        yield Found(start, end, "ipv4", guard)


def _ipv4_guard(text: str, start: int, end: int) -> str | None:
    try:
        address = ipaddress.IPv4Address(text[start:end])
    except ValueError:
        return "invalid"
    before, before2 = _char(text, start - 1), _char(text, start - 2)
    after, after2 = _char(text, end), _char(text, end + 1)
    if (before == "." and before2.isalnum()) or (after == "." and after2.isalnum()):
        return "longer_dotted"
    if before.isalnum() or before == "_" or after.isalnum() or after == "_":
        return "attached"
    if after in "-+~" and after2.isalnum() and not _QUAD.match(text, end + 1):
        return "version_suffix"
    if before in "-+~" and before2.isalnum() and not _QUAD_BEFORE.search(text, max(0, start - 16), start - 1):
        return "version_prefix"
    if before == ":" and _ipv6_tail(text, start, end):
        return "in_ipv6"
    guard = _context_guard(text, start, end)
    if guard is None and not _public(address):
        return "not_public"
    return guard


def _ipv6_tail(text: str, start: int, end: int) -> bool:
    """Whether the quad at ``start`` is the IPv4 tail of an IPv6 address (``::ffff:8.8.8.8``, judged whole by
    :func:`find_ipv6`)."""
    first = start - 1
    while first > 0 and text[first - 1] in _HEX and start - first < 40:
        first -= 1
    try:
        ipaddress.IPv6Address(text[first:end])
    except ValueError:
        return False
    return True


def _written_alone(text: str, triple: str) -> bool:
    """Whether ``text`` writes ``a.b.c`` as a token of its own (``Git 1.7.8``): then ``1.7.8.4`` in it is that
    version's fourth part. Asked only for a quad that passed every other guard, with ``str.find``."""
    at = text.find(triple)
    while at != -1:
        end = at + len(triple)
        before, after = _char(text, at - 1), _char(text, end)
        touched = before.isalnum() or before in "._" or after.isalnum() or after == "_"
        if not touched and not (after == "." and _char(text, end + 1).isdigit()):
            return True
        at = text.find(triple, at + 1)
    return False


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Publicly routable: ``is_global`` (the IANA special-purpose registries) and not multicast, which
    ``is_global`` lets through (224.0.0.251 is mDNS on every LAN)."""
    return address.is_global and not address.is_multicast


def _char(text: str, i: int) -> str:
    return text[i] if 0 <= i < len(text) else " "


def _context_guard(text: str, start: int, end: int) -> str | None:
    """The guards that read the quad's line: an epoch, a changelog heading, a constraint, a version word in
    the same clause."""
    if _EPOCH_BEFORE.search(text, max(0, start - 6), start):
        return "epoch"
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    heading = _HEADING.match(text, line_start, line_end if line_end != -1 else len(text))
    if heading and heading.start(1) <= start and end <= heading.end(1):
        return "changelog_heading"
    if _CONSTRAINT_BEFORE.search(text, max(0, start - 8), start):
        return "version_constraint"
    if "\u00a7" in text[max(0, start - 2) : start]:  # "§6.3.1.4", "§ 6.3.1.4"
        return "section_word"
    words = _WORDS_BEFORE.search(text, max(line_start, start - 48), start)
    if words:  # the word right before, or a version word and a connector ("upgrade to 1.2.3.4")
        last, first = (words.group(2) or words.group(1)).lower(), words.group(1).lower()
        if last in VERSION_WORDS or (last in CONNECTORS and first in VERSION_WORDS and words.group(2)):
            return "version_word"
        if last in SECTION_WORDS:
            return "section_word"
    return None


# ---------------------------------------------------------------- IPv6


def find_ipv6(text: str) -> Iterator[Found]:
    """Every token of ``text`` that parses as an IPv6 address, in order, with its guard (``attached`` to a
    word, ``not_public``, ``outside_2000::/3``) or ``None`` (redacted); an IPv4-mapped address is judged by its
    IPv4 address; one followed by a port without brackets loses the port. Times and MAC addresses do not parse
    and are not candidates."""
    pos = 0
    for hit in _V6_HIT.finditer(text):
        if hit.start() < pos:
            continue
        start = hit.start()
        while start > 0 and text[start - 1] in _HEX and hit.start() - start < 40:
            start -= 1
        token = _V6_TOKEN.match(text, start)
        if token is None:  # cannot happen: the hit itself is a token
            continue
        pos = token.end()
        end = _trim_v6(text, start, token.end())
        address = _parse_v6(text[start:end])
        if (
            address is None and text.rfind(":", start, end) > start
        ):  # a full address and a port: "...:25de:443"
            end = text.rfind(":", start, end)
            address = _parse_v6(text[start:end])
        if address is not None and end - start > 2:  # "::" alone is C++ and Perl more often than an address
            yield Found(start, end, "ipv6", _ipv6_guard(text, start, end, address))


def _parse_v6(token: str) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(token)
    except ValueError:
        return None


def _trim_v6(text: str, start: int, end: int) -> int:
    """The token's end without a sentence's full stop or a single trailing colon (``::`` stays)."""
    while end > start and text[end - 1] == ".":
        end -= 1
    if end - start > 2 and text[end - 1] == ":" and text[end - 2] != ":":
        end -= 1
    return end


def _ipv6_guard(text: str, start: int, end: int, address: ipaddress.IPv6Address) -> str | None:
    before, after = _char(text, start - 1), _char(text, end)
    if before.isalnum() or before == "_" or after.isalnum() or after == "_":
        return "attached"
    mapped = address.ipv4_mapped  # ::ffff:a.b.c.d is the IPv4 address a.b.c.d
    if not _public(mapped or address):
        return "not_public"
    if sum(1 for group in text[start:end].split(":") if group) < 2:  # "2000::" in "Oct 1 2000::" is no host
        return "one_group"
    if mapped is None and address not in _GLOBAL_UNICAST:
        return "outside_2000::/3"
    return None


# ---------------------------------------------------------------- redaction


def redact(text: str, cfg: PiiConfig) -> tuple[str, int, int]:
    """``(text with every unguarded address replaced, emails replaced, IPs replaced)``."""
    spans: list[tuple[int, int, bool, str]] = []  # (start, end, is an email, placeholder)
    if cfg.emails and "@" in text:
        spans += [(f.start, f.end, True, cfg.email_placeholder) for f in find_emails(text) if f.guard is None]
    if cfg.ips:
        spans += [(f.start, f.end, False, cfg.ip_placeholder) for f in find_ipv4(text) if f.guard is None]
        if ":" in text:
            spans += [
                (f.start, f.end, False, cfg.ipv6_placeholder) for f in find_ipv6(text) if f.guard is None
            ]
    if not spans:
        return text, 0, 0
    spans.sort()
    pieces, pos, emails, ips = [], 0, 0, 0
    for start, end, is_email, placeholder in spans:
        if start < pos:  # overlaps the previous address (an IPv4 tail inside an IPv6 one)
            continue
        pieces += [text[pos:start], placeholder]
        pos = end
        emails += is_email
        ips += not is_email
    pieces.append(text[pos:])
    return "".join(pieces), emails, ips


def redact_document(text: str, source_uri: str, meta: str, cfg: PiiConfig, counts: Counter[str]) -> str:
    """``text`` redacted when ``cfg`` applies to its source; counts the replacements in ``counts``
    (``pii.email``, ``pii.ip`` and the same per source name: ``pii.email.<source>``)."""
    if not applies(cfg, source_uri):
        return text
    text, emails, ips = redact(text, cfg)
    counts["pii.email"] += emails
    counts["pii.ip"] += ips
    if emails or ips:
        name = provenance(meta)[0]
        for kind, n in (("email", emails), ("ip", ips)):
            if n:
                counts[f"pii.{kind}.{name}"] += n
    return text
