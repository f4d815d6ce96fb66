"""Real wget WARCs for check_archives.py: wget (>= 1.20 writes ``WARC-Target-URI: <…>``) crawls a small site on
127.0.0.1 whose pages come as servers send them: gzip, deflate, brotli and zstd bodies, chunked (and gzipped and
chunked), latin-1 and Shift-JIS and undeclared cp1252, XHTML, a UTF-8 byte-order mark, a percent-encoded path, an
empty page, a redirect, a 404 and JSON. Three archives: per-record gzip, plain, and ``--compression=auto``.

    python tests/bench/wget_archives.py OUT_DIR && python tests/bench/check_archives.py OUT_DIR
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import brotli
import zstandard

WORDS = "The river runs past the stone bridge and the garden of the old village on a winter morning."


def page(title: str, extra: str = "", charset: str | None = "utf-8") -> str:
    head = f'<meta charset="{charset}">' if charset else ""
    body = "".join(f"<p>{WORDS} {title} paragraph {i}. {extra}</p>" for i in range(6))
    return (
        f"<!DOCTYPE html><html><head>{head}<title>{title}</title></head><body><nav><a href='/'>Home</a></nav>"
        f"<article><h1>{title}</h1>{body}</article><footer>All rights reserved.</footer></body></html>"
    )


# path: (Content-Type, body bytes, how it is sent)
PAGES: dict[str, tuple[str, bytes, str]] = {
    "/plain.html": ("text/html; charset=utf-8", page("Plain page").encode(), ""),
    "/gzip.html": ("text/html; charset=utf-8", page("Gzipped page").encode(), "gzip"),
    "/deflate.html": ("text/html; charset=utf-8", page("Deflated page").encode(), "deflate"),
    "/br.html": ("text/html; charset=utf-8", page("Brotli page").encode(), "br"),
    "/zstd.html": ("text/html; charset=utf-8", page("Zstd page").encode(), "zstd"),
    "/chunked.html": ("text/html; charset=utf-8", page("Chunked page").encode(), "chunked"),
    "/gzip-chunked.html": ("text/html; charset=utf-8", page("Gzipped, chunked").encode(), "gzip+chunked"),
    "/latin1.html": (
        "text/html; charset=ISO-8859-1",
        page("Café crème", "naïve", None).encode("latin-1"),
        "",
    ),
    "/sjis.html": (
        "text/html",
        page("日本語のページ", "東京の川と石の橋", "shift_jis").encode("shift_jis"),
        "",
    ),
    "/cp1252.html": ("text/html", page("Undeclared “quotes”", "café – naïve", None).encode("cp1252"), ""),
    "/xhtml.xhtml": ("application/xhtml+xml", page("XHTML page").encode(), ""),
    "/bom.html": ("text/html", "\ufeff".encode() + page("BOM page", charset=None).encode(), ""),
    "/%C3%BCber.html": ("text/html; charset=utf-8", page("Über page").encode(), ""),
    "/empty.html": ("text/html; charset=utf-8", b"", ""),
    "/data.json": ("application/json", b'{"a": 1}', ""),
}
ENCODE = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b),
}


class Site(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path in ("/", "/index.html"):
            links = "".join(f'<li><a href="{p}">{p}</a></li>' for p in [*PAGES, "/moved", "/missing.html"])
            return self.reply(
                200, "text/html; charset=utf-8", page("Index", f"<ul>{links}</ul>").encode(), ""
            )
        if self.path == "/moved":
            self.send_response(301)
            self.send_header("Location", "/plain.html")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if self.path not in PAGES:
            return self.reply(404, "text/html", b"<html><p>not here</p></html>", "")
        return self.reply(200, *PAGES[self.path])

    def reply(self, code: int, ctype: str, body: bytes, how: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        encoding = how.replace("+chunked", "").replace("chunked", "")
        if encoding:
            body = ENCODE[encoding](body)
            self.send_header("Content-Encoding", encoding)
        if "chunked" not in how:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(0, len(body), 300):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(body[i : i + 300]), body[i : i + 300]))
        self.wfile.write(b"0\r\n\r\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if shutil.which("wget") is None:
        print("wget is not installed", file=sys.stderr)
        return 1
    version = subprocess.run(["wget", "--version"], capture_output=True, text=True).stdout.split()[2]
    args.out.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    variants = {"": [], "-plain": ["--no-warc-compression"], "-compression-auto": ["--compression=auto"]}
    try:
        for suffix, flags in variants.items():
            name = args.out / f"wget-{version}{suffix}"
            mirror = args.out / f"mirror{suffix}"
            cmd = ["wget", "-q", "-r", "-l", "2", "-e", "robots=off", "--no-warc-keep-log", *flags]
            subprocess.run([*cmd, f"--warc-file={name}", "-P", str(mirror), url], check=False)
            shutil.rmtree(mirror, ignore_errors=True)
    finally:
        server.shutdown()
    for path in sorted(args.out.glob("wget-*.warc*")):
        print(path, path.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
