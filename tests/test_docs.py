"""The README and every page of docs/ run as written.

Convention for code blocks in README.md and docs/*.md (write new pages by it):
- A fenced block marked ```python or ```bash is RUN, in page order, in one temporary directory
  per page: a python block as a script of its own (`python block.py`: make each self-contained),
  a bash block with `bash -euo pipefail`. `python` and `lakeckpt` are this venv's (its bin/ is
  first on PATH); LAKECKPT_HOME and PYICEBERG_HOME point into the directory, and the
  environment's AWS_* and PYICEBERG_CATALOG__* variables are removed, so the default catalog is
  a fresh one and nothing outside the directory is read or written.
- `<!-- file: NAME -->` on the line before a block (of any language) writes it to NAME instead
  of running it; a later bash block uses it (`python NAME`, `. ./NAME`).
- `<!-- illustration -->` (optionally `<!-- illustration: why -->`) on the line before a python or
  bash block shows it without running it: a fragment, a path that does not exist here, a
  command that sets up a machine. Every other fence (```text, ```toml, ...) is an illustration.
- `<!-- after: README.md -->` anywhere in a page: the page starts in a copy of the directory the
  README left (its tables, checkpoints and default catalog), so it can inspect them cheaply.
- `<!-- port: 9000 -->` anywhere in a page: the page's commands name a local server on port
  9000; the test runs them with a free port instead (the only rewrite it makes).
Every block must exit 0 and print no warning (no "Warning" on stderr). Processes a page leaves
running in the background (a local S3 server) are killed when the page ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*(illustration|file)\s*(?::\s*([^>]*?))?\s*-->\s*$")
_AFTER = re.compile(r"<!--\s*after:\s*(\S+)\s*-->")
_PORT = re.compile(r"<!--\s*port:\s*(\d+)\s*-->")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    mark: str  # "run", "illustration" or "file"
    arg: str = ""

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang})"


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, with their marks."""
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        lang = m.group(1)
        kind = "run" if lang in ("python", "bash") else "illustration"
        if mark and (kind == "run" or mark.group(1) == "file"):
            kind = mark.group(1)
        out.append(Block(page.name, line, lang, m.group(2), kind,
                         (mark.group(2) or "") if mark else ""))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "PYICEBERG_CATALOG__", "LAKECKPT_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", LAKECKPT_HOME=str(work / ".home"),
               PYICEBERG_HOME=str(work / ".home"), PYTHONUNBUFFERED="1")
    return env


def run_page(page: Path, work: Path, scratch: Path) -> str:
    """Run the page's blocks in ``work``; returns what they printed."""
    text = page.read_text()
    port = _PORT.search(text)
    fresh = str(_free_port()) if port else ""
    env = _env(work)
    groups: list[int] = []
    shown: list[str] = []
    try:
        for i, block in enumerate(blocks(page)):
            code = block.code.replace(port.group(1), fresh) if port else block.code
            if block.mark == "illustration":
                continue
            if block.mark == "file":
                (work / block.arg).write_text(code)
                continue
            script = scratch / f"block{i}.{'py' if block.lang == 'python' else 'sh'}"
            script.write_text(code)
            argv = ([str(BIN / "python"), str(script)] if block.lang == "python"
                    else ["bash", "-euo", "pipefail", str(script)])
            began = time.monotonic()
            proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            groups.append(proc.pid)
            out, err = proc.communicate(timeout=150)
            took = time.monotonic() - began
            shown.append(f"--- {block} exit {proc.returncode} in {took:.1f} s\n{out}{err}")
            assert proc.returncode == 0, "\n".join(shown)
            assert "Warning" not in err, f"{block} printed a warning:\n{err}"
    finally:
        for pgid in groups:  # background processes the page started (its S3 server)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    return "".join(shown)


# What a page's commands must print, beyond exiting 0 without a warning: the story the page tells.
EXPECTED = {
    "README.md": ["delta: step 80", "iceberg: step 80", "finished", "quickstart-delta"],
    "s3-end-to-end.md": ["delta: starting at step 8", "delta: finished at step 16",
                         "iceberg: finished at step 16"],
    "azure-gcs-end-to-end.md": ["az iceberg rows: 2048", "gs iceberg rows: 2048",
                                "az: starting at step 4", "gs: starting at step 4",
                                "az: stopped at step 8", "gs: stopped at step 8"],
    "checkpoints-and-ledger.md": ["[25, 50, 75, 80]", "evaluating step 50", "does not fit",
                                  "is not the run's newest",
                                  "is removed", "has no checkpoint", "step 80 weight norm",
                                  "its own rows: 1280 with its lineage: 13840",
                                  "quickstart-rewind,quickstart-delta,50"],
    "audit-and-progress.md": ["6400", "violations=[]", "(25, 'removed')", "exit 2"],
    "pretraining.md": ["torch.Size([4, 16])", "'code'", "resumed exactly: True"],
    "training.md": ["['id', 'target', 'x'] (256, 4) 0.0"],
}


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The directory the README's quickstart leaves, and what it printed."""
    work = tmp_path_factory.mktemp("README")
    return work, run_page(ROOT / "README.md", work, tmp_path_factory.mktemp("README-blocks"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_readme_quickstart_runs_as_written_without_a_warning(
        readme: tuple[Path, str]) -> None:
    work, printed = readme  # run_page asserted exit statuses and stderr free of warnings
    for text in EXPECTED["README.md"]:
        assert text in printed, f"the quickstart did not print {text!r}:\n{printed}"
    assert "False" not in printed  # lakeckpt verify: every run ok
    progress = [line for line in printed.splitlines() if "quickstart-" in line and "━" in line]
    done = re.compile(r"│\s*100(\.0*)?\s*%?\s*│")  # percent of every pass of both runs
    assert len(progress) == 4 and all(done.search(line) for line in progress), printed
    assert (work / ".home" / "catalog.db").is_file()  # the default catalog was the fresh one


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "README.md"],
                         ids=lambda p: p.name)
def test_a_docs_page_runs_as_written(page: Path, request: pytest.FixtureRequest,
                                     tmp_path: Path) -> None:
    runnable = [b for b in blocks(page) if b.mark != "illustration"]
    assert runnable or page.name not in EXPECTED
    if not runnable:
        return  # nothing to run: every block is an illustration
    after = _AFTER.search(page.read_text())
    work = tmp_path / "work"
    if after:
        assert after.group(1) == "README.md", f"{page.name}: only 'after: README.md' is known"
        shutil.copytree(request.getfixturevalue("readme")[0], work, symlinks=True)
    else:
        work.mkdir()
    (tmp_path / "blocks").mkdir()
    printed = run_page(page, work, tmp_path / "blocks")
    for text in EXPECTED.get(page.name, []):
        assert text in printed, f"{page.name} did not print {text!r}:\n{printed}"
    assert "False" not in printed, printed


def test_the_readme_is_short_and_every_page_is_linked_from_it() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in PAGES[1:]:
        assert f"(docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_of_a_page_lead_to_files_and_headings_that_exist(page: Path) -> None:
    text = page.read_text()
    for target in re.findall(r"\]\(([^)#\s]*)(#[^)\s]*)?\)", text):
        path, anchor = target
        if path.startswith(("http://", "https://", "mailto:")):
            continue
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name} links to {path}, which does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor[1:] in _anchors(dest), f"{page.name} links to {path}{anchor}: no heading"


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.*?)\s*$", _FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_the_block_convention_is_read_as_documented(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nprint(1)\n```\n<!-- illustration: a fragment -->\n```bash\n"
                    "false\n```\n<!-- file: t.py -->\n```python\nx = 1\n```\n```text\nno\n```\n"
                    "<!-- file: a.env -->\n```bash\nA=1\n```\n")
    got = [(b.lang, b.mark, b.arg) for b in blocks(page)]
    assert got == [("python", "run", ""), ("bash", "illustration", "a fragment"),
                   ("python", "file", "t.py"), ("text", "illustration", ""),
                   ("bash", "file", "a.env")]


def test_every_error_class_is_named_in_public_names() -> None:
    errors = (ROOT / "lakeckpt_tables" / "errors.py").read_text()
    names = re.findall(r"^class (\w+)\(", errors, re.M)
    page = (ROOT / "docs" / "public-names.md").read_text()
    assert names and not [n for n in names if f"`{n}`" not in page], \
        [n for n in names if f"`{n}`" not in page]
