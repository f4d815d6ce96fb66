"""Each HTML extractor extra, installed the way a user installs it, in a fresh venv: does it extract text?

`pip install 'pileworks[trafilatura]'` once installed lxml 6 without `lxml.html.clean`, which trafilatura and
jusText import, and the extractor then said "not installed". This installs each extra's requirements as pyproject.toml
lists them (nothing else of pileworks: the check is the extra's set) into a new venv and runs
`pipeline.ingest.html`'s extractor on a page there.

    python .ci/extras.py [--venv-root DIR] [trafilatura justext ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CHECK = """
from pipeline.ingest.html import HtmlConfig, build_extractor
words = " ".join(["The river runs past the stone bridge and the garden of the old village."] * 12)
page = ("<html><head><title>t</title></head><body><nav><a href='/'>Home</a></nav><article><h1>A title</h1>"
        + "".join(f"<p>{words} Paragraph {i}.</p>" for i in range(4)) + "</article><footer>(c) Example</footer></body></html>")
text = build_extractor(HtmlConfig(extractor=NAME))(page)
assert text.count("stone bridge") >= 12, text[:300]
print(NAME, "extracts", len(text), "characters")
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("extras", nargs="*", default=["trafilatura", "justext"])
    parser.add_argument("--venv-root", default=None)
    args = parser.parse_args()
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    with tempfile.TemporaryDirectory(dir=args.venv_root) as tmp:
        for name in args.extras:
            venv = Path(tmp) / name
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            subprocess.run([*pip, *optional[name]], check=True, stdin=subprocess.DEVNULL)
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-c", CHECK.replace("NAME", repr(name))],
                cwd=ROOT,
                env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                capture_output=True,
                text=True,
            )
            sys.stdout.write(done.stdout)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-3000:])
                print(
                    f"pileworks[{name}] installed from pyproject.toml does not extract text", file=sys.stderr
                )
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
