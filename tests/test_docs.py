"""The docs' code cannot drift: every fenced block of README.md and docs/*.md whose info
string is `python runnable` (`python runnable np=N` for N ranks, 1 by default) runs here,
as written, at its rank count; and the stale claims once found in the docs stay gone."""
import importlib.util
import re
from pathlib import Path

import pytest

from harness import run_ranks

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(200)

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)(.*)$")


def runnable_blocks(path):
    """[(first line number, np, source)] of the blocks marked runnable in one file."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, words = m.group(1), m.group(2).split()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if lang == "python" and words[:1] == ["runnable"]:
            opts = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            bad = [w for w in words[1:] if not re.fullmatch(r"np=[1-9]\d*", w)]
            assert not bad, f"{path.name}:{i + 1}: unknown marker {bad}; write np=N"
            out.append((i + 1, int(opts.get("np", 1)), "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return out


BLOCKS = [(p, line, np_, src) for p in DOCS for line, np_, src in runnable_blocks(p)]


def test_the_docs_carry_runnable_blocks():
    # the README's training loop and the pipeline's first example at least
    where = {(p.name, np_) for p, _, np_, _ in BLOCKS}
    assert {("README.md", 2), ("pipeline.md", 2)} <= where, where


@pytest.mark.parametrize("path,line,np_,src", BLOCKS,
                         ids=[f"{p.name}:{line}" for p, line, _, _ in BLOCKS])
def test_a_runnable_block_runs_as_written(path, line, np_, src, tmp_path):
    script = tmp_path / f"{path.stem}_{line}.py"
    script.write_text(src)
    res = run_ranks(script, np_, "horovodlikerun" if np_ > 1 else "python", timeout=180)
    assert res.returncode == 0, f"{path.name}:{line} at {np_} rank(s)\n{res.describe()}"


def test_the_install_story_claims_no_published_package():
    readme = (REPO / "README.md").read_text()
    first = readme.split("\n## ", 2)[1]
    assert first.startswith("Install\n"), first[:80]
    assert "pip install .\n" in first.replace("  ", "") or "pip install . " in first, first
    assert "download.pytorch.org/whl/cpu" in first and "dist/horovodlike-" in first
    for path in DOCS:
        text = path.read_text()
        assert not re.search(r"pip install horovodlike\b", text), path.name


def test_no_stale_claims():
    assert "not in this release yet" not in (REPO / "docs" / "tensor_parallel.md").read_text()
