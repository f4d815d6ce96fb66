"""Each HTML extractor extra, installed the way a user installs it, in a fresh venv: does it extract text?

`pip install 'pileworks[trafilatura]'` once installed lxml 6 without `lxml.html.clean`, which trafilatura and
jusText import, and the extractor then said "not installed". This copies the working tree, makes a new venv, puts
torch's CPU wheel in first (as `make setup` does: nothing may pull a CUDA build), then runs
`pip install '<copy>[EXTRA]'` for each extra in turn and has the installed pileworks (not this checkout) extract a
page with that extractor.

One venv, not one per extra: a full install of pileworks takes about 3 minutes here. Before each extra, the
packages any extractor extra brings (EXTRA_PACKAGES) are uninstalled, so each extra must bring back on its own
what its extractor imports: an extra that lost `lxml_html_clean` from its list fails here even when the extra
checked before it had installed it.

    python .ci/extras.py [--torch torch==2.13.0] [--venv-root DIR] [justext trafilatura ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECK = """
import pipeline
from pipeline.ingest.html import HtmlConfig, build_extractor
words = " ".join(["The river runs past the stone bridge and the garden of the old village."] * 12)
page = ("<html><head><title>t</title></head><body><nav><a href='/'>Home</a></nav><article><h1>A title</h1>"
        + "".join(f"<p>{words} Paragraph {i}.</p>" for i in range(4)) + "</article><footer>(c) Example</footer></body></html>")
text = build_extractor(HtmlConfig(extractor=NAME))(page)
assert text.count("stone bridge") >= 12, text[:300]
assert pipeline.__file__.startswith(VENV), pipeline.__file__  # the installed package, not a checkout
print(NAME, "extracts", len(text), "characters")
"""


# every package an extractor extra lists or pulls in for the extractors' HTML cleaning
EXTRA_PACKAGES = ["trafilatura", "justext", "lxml_html_clean"]


def copy_tree(dest: Path) -> Path:
    """The working tree's files that git knows or would add (not .venv, builds, stores) copied to ``dest``: pip
    builds there, not in the checkout that `make test` is running from."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("extras", nargs="*", default=["justext", "trafilatura"])
    parser.add_argument("--torch", default="torch==2.13.0", help="torch's requirement, installed first")
    parser.add_argument("--venv-root", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.venv_root) as tmp:
        source, venv = copy_tree(Path(tmp) / "pileworks"), Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        # --no-compile: no .pyc of the 1.8 GB installed (half the CPU); the check imports what it needs
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
        started = time.monotonic()
        subprocess.run([*pip, args.torch], check=True, stdin=subprocess.DEVNULL)
        print(f"{args.torch}: {time.monotonic() - started:.0f} s", flush=True)
        for name in args.extras:
            # what an earlier extra left must not stand in for this one's requirements
            subprocess.run(
                [python, "-m", "pip", "uninstall", "-y", "-q", *EXTRA_PACKAGES],
                check=True,
                stdin=subprocess.DEVNULL,
                capture_output=True,
            )
            started = time.monotonic()
            subprocess.run([*pip, f"{source}[{name}]"], check=True, stdin=subprocess.DEVNULL)
            print(f"pip install 'pileworks[{name}]': {time.monotonic() - started:.0f} s", flush=True)
            done = subprocess.run(
                [python, "-c", CHECK.replace("NAME", repr(name)).replace("VENV", repr(str(venv)))],
                cwd=tmp,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DS_ACCELERATOR": "cpu"},
                capture_output=True,
                text=True,
            )
            sys.stdout.write(done.stdout)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-3000:])
                print(f"pip install 'pileworks[{name}]' does not extract text", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
