"""The documents match what happens: commands that are current, settings as the code reads them,
figures that say where they came from, and CI running the README's own test command."""

from __future__ import annotations

import glob
import os
import re

import pytest

from conftest import ROOT
from fastcoll.config import FLAG_OFF, FLAG_ON, Config

README_TEST_COMMAND = 'pip install -e ".[test,lm]" && python -m pytest -q'


def read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def documents() -> list[str]:
    """Every document a user reads, relative to the repository."""
    found = ["README.md", "launch/README.md", "bench/README.md", *glob.glob("docs/*.md", root_dir=ROOT),
             *glob.glob("examples/*.py", root_dir=ROOT)]
    return [p for p in found if os.path.exists(os.path.join(ROOT, p))]


def quick_start() -> str:
    text = read("README.md")
    return text[text.index("## Quick start"):text.index("## API")]


def test_no_document_starts_mlx_lms_server_the_deprecated_way():
    # mlx-lm 0.32 prints a deprecation on every rank for `python -m mlx_lm.server`.
    for path in documents():
        assert "-m mlx_lm.server" not in read(path), path
    assert "-m mlx_lm server" in read("docs/mlx.md")


def test_the_readme_lists_exactly_what_fastcoll_shm_accepts():
    line = next(x for x in read("README.md").splitlines() if x.startswith("| `FASTCOLL_SHM`"))
    words = set(re.findall(r"`([^`]+)`", line)) - {"FASTCOLL_SHM", "tcp"}
    assert words == set(FLAG_ON + FLAG_OFF), line
    for word in FLAG_ON + FLAG_OFF:
        for spelled in (word, word.upper()):
            assert Config.from_env({"FASTCOLL_SHM": spelled}).shm is (word in FLAG_ON)
    assert Config.from_env({"FASTCOLL_SHM": ""}).shm is True and Config.from_env({}).shm is True
    with pytest.raises(ValueError) as e:
        Config.from_env({"FASTCOLL_SHM": "maybe"})
    assert str(e.value).startswith("FASTCOLL_SHM must be 0 or 1") and "'maybe'" in str(e.value)
    assert all(w in str(e.value) for w in FLAG_ON + FLAG_OFF), e.value


def test_ci_runs_the_readmes_test_command_verbatim_then_the_slow_tests():
    assert README_TEST_COMMAND in quick_start()
    ci = read(".ci/run").splitlines()
    at = [i for i, line in enumerate(ci) if line.startswith(README_TEST_COMMAND)]
    steps = [i for i, line in enumerate(ci) if line.startswith("step ")]
    assert len(at) == 1 and steps and at[0] < min(steps), "the README's command, verbatim, then the steps"
    assert 'step "slow tests" python -m pytest -q -m slow' in ci


def test_the_readme_says_what_the_test_command_starts_and_how_to_skip_it():
    text = " ".join(quick_start().split())
    for words in ("sshd", "network namespaces", '-m "not slow and not sshd"', "-m slow", ".ci/run"):
        assert words in text, words
    testing = " ".join(read("docs/testing.md").split())
    for words in ("sshd", "network namespaces", '-m "not slow and not sshd"', "-m slow", ".ci/run"):
        assert words in testing[:3000], words  # up front


# A measured figure: a time, a rate or a duration in minutes.
FIGURE = re.compile(r"\b\d+(\.\d+)? ?(us|ms|GB/s|s|min)\b")
# Where a figure came from: the machine, the date and time, and the load.
SOURCE = (re.compile(r"\d-core"), re.compile(r"20\d\d-\d\d-\d\d \d\d:\d\d UTC"), re.compile(r"load average \d"))


def test_every_readme_figure_says_where_it_came_from():
    """Each paragraph or output block of the README with a measured figure says the machine, the
    date and time and the load; an output block, in the paragraph that introduces it."""
    blocks = re.split(r"\n\s*\n", read("README.md"))
    checked = 0
    for i, block in enumerate(blocks):
        fenced = block.startswith("```")
        # Tables hold settings and defaults, inline code quotes messages: neither is a measurement.
        if block.startswith("|") or not FIGURE.search(block if fenced else re.sub(r"`[^`]*`", "", block)):
            continue
        context = " ".join((blocks[i - 1] + block if fenced else block).split())  # lines joined
        for source in SOURCE:
            assert source.search(context), f"{source.pattern} missing where the README says:\n{block}"
        checked += 1
    assert checked >= 1  # the quick start's output


def test_no_document_installs_fastcoll_from_the_package_index():
    """fastcoll is not on the package index: `pip install "fastcoll[lm]"` fails. Every install
    command for it names a clone (`.`, `./fastcoll[lm]`) or git (`fastcoll[lm] @ git+URL`), in
    the documents, the examples' messages and the package's own words."""
    from_index = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?fastcoll(\[[\w,]*\])?(?!\S*\s*@)['\"]?(?=[\s`'\")]|$)")
    texts = {path: read(path) for path in documents()}
    for top in ("fastcoll", "tests", "examples"):
        for path in glob.glob(f"{top}/**/*.py", root_dir=ROOT, recursive=True):
            if path != os.path.join("tests", "test_docs.py"):  # this test quotes what it looks for
                texts[path] = read(path)
    offending = {path: m.group(0) for path, text in texts.items() if (m := from_index.search(text))}
    assert offending == {}, offending
    assert from_index.search('pip install "fastcoll[lm]"') and from_index.search("pip install fastcoll")
    assert not from_index.search('pip install "fastcoll[lm] @ git+URL"')
    assert not from_index.search('pip install "./fastcoll[lm]"') and not from_index.search("pip install fastcoll-x")
    assert 'pip install "fastcoll[lm] @ git+URL"' in read("docs/macs.md") and "@ git+URL" in read("README.md")


# What makes a document a lab notebook rather than a manual: a section named by the day or the
# round of work that produced it, an issue number, a citation of bench/NOTES.md by entry number.
DATED_HEADING = re.compile(r"^#+ .*\b20\d\d-\d\d-\d\d\b", re.M)
ISSUE = re.compile(r"\bissue \d+", re.I)
NOTES_ENTRY = re.compile(r"\bNOTES(\.md)?`?,? (entry |entries )?\d+|\bentr(y|ies) \d+", re.I)


def notebook_marks(text: str) -> list[str]:
    """Every date-named heading, issue number and NOTES entry citation in a document."""
    return [m.group(0) for pattern in (DATED_HEADING, ISSUE, NOTES_ENTRY) for m in pattern.finditer(text)]


def test_the_docs_are_a_manual_not_a_lab_notebook():
    """docs/ describes the system as it is: no section titled by a date, no issue numbers, no
    bench/NOTES.md entries cited by number (a figure links its record folder instead)."""
    pages = glob.glob("docs/*.md", root_dir=ROOT)
    assert len(pages) >= 7, pages
    found = {path: marks for path in pages if (marks := notebook_marks(read(path)))}
    assert found == {}, found
    # The patterns catch what the docs used to say.
    for old in ("## The run of record: localhost, 2026-11-30", "## Issue 24's localhost targets again",
                "(bench/NOTES.md 74)", "(`bench/NOTES.md`, entry 12)", "(NOTES 92)", "NOTES.md entries 5 and 11"):
        assert notebook_marks(old), old
    for fine in ("## Performance", "see [bench/NOTES.md](../bench/NOTES.md)", "a 2026-12-06 record",
                 "`bench/records/2026-12-06-h200/`", "8 entries", "tissue 5"):
        assert not notebook_marks(fine), fine


def test_the_readme_links_the_one_page_for_macs():
    """Running across Macs, RDMA over Thunderbolt included, is one page the README links."""
    assert "(docs/macs.md)" in read("README.md")
    macs = read("docs/macs.md")
    assert "rdma_ctl enable" in macs and "--check" in macs and "sharded_generate.py" in macs
    for path in ("docs/mlx.md", "docs/multihost.md", "launch/README.md"):
        assert "rdma_ctl" not in read(path) and "macs.md" in read(path), path


# Runs of record (bench/README.md): each keeps its README, its results tables, plots and scripts
# loose, and its raw outputs in one archive, so that a clone carries a few MB of records.
RECORDS = os.path.join(ROOT, "bench", "records")
ARCHIVE = "raw.tar.xz"
RECORD_MAX_FILES = 40  # loose files of one record, its archive and README included
RECORD_MAX_BYTES = 700 << 10  # their bytes (the largest: two localhost sets' eight plots)
RECORDS_MAX_BYTES = 5 << 20  # all records together, archives included
# A data file a record's README names: `path.ext` in backticks, or a Markdown link's target (a
# script's name may be the repository's or another record's, so scripts are not held to this).
CITED_FILE = re.compile(r"`([\w.\-/]+\.(?:json|md|txt|csv|png|svg|gz|log|jsonl|xz|tgz))`"
                        r"|\]\(([^)\s#]+)\)")
ELSEWHERE = ("bench/", "docs/", "tests/", "fastcoll/", "examples/", "launch/", ".ci/", "/", "../", "http", "$")
# A record cited from a document: bench/records/DATE-WHAT, maybe a path inside it.
RECORD_CITE = re.compile(r"(?:bench/)?records/(20\d\d-\d\d-\d\d-[\w.\-]*\w)((?:/[\w.\-]+)*)/?(?![\w*\-])")


def record(name: str) -> tuple[dict[str, int], set[str]]:
    """A record's loose files (path in the record: bytes) and the members of its archive."""
    import tarfile

    base, loose = os.path.join(RECORDS, name), {}
    for folder, _, files in os.walk(base):
        for f in files:
            path = os.path.join(folder, f)
            loose[os.path.relpath(path, base).replace(os.sep, "/")] = os.path.getsize(path)
    members = set()
    if ARCHIVE in loose:
        with tarfile.open(os.path.join(base, ARCHIVE), "r:xz") as tar:
            members = {m.name for m in tar.getmembers() if m.isfile()}
    return loose, members


def records() -> dict[str, tuple[dict[str, int], set[str]]]:
    return {name: record(name) for name in sorted(os.listdir(RECORDS))}


def resolves(path: str, loose: dict[str, int], members: set[str]) -> bool:
    """Whether a path inside a record is a loose file or folder, or a member or folder of its archive."""
    path = path.strip("/")
    everything = set(loose) | members
    return not path or path in everything or any(p.startswith(path + "/") for p in everything)


def test_every_record_keeps_its_raw_files_in_one_archive_and_stays_small():
    found, total = records(), 0
    assert len(found) >= 40, list(found)
    for name, (loose, members) in found.items():
        assert "README.md" in loose, f"{name} has no README.md"
        assert len(loose) <= RECORD_MAX_FILES, f"{name}: {len(loose)} loose files; put raw ones in {ARCHIVE}"
        assert sum(loose.values()) <= RECORD_MAX_BYTES, f"{name}: {sum(loose.values())} bytes"
        assert not [p for p in loose if p.endswith((".tar.xz", ".tgz", ".tar.gz")) and p != ARCHIVE], name
        assert not set(loose) & members, f"{name}: loose and archived both: {set(loose) & members}"
        if members:
            readme = read(f"bench/records/{name}/README.md")
            assert f"tar -xJf {ARCHIVE}" in readme, f"{name}'s README does not say how to unpack {ARCHIVE}"
        total += sum(loose.values())
    assert total <= RECORDS_MAX_BYTES, f"bench/records/ holds {total} bytes"


def readme_cites(text: str) -> list[str]:
    """The files a record's README names inside the record (not the repository's own paths)."""
    found = [a or b for a, b in CITED_FILE.findall(text)]
    return [p for p in found if not p.startswith(ELSEWHERE) and "." in p.rsplit("/", 1)[-1]]


def test_a_records_readme_cites_only_what_it_keeps_or_archives():
    """Each file a record's README names is a loose file or a member of its archive: by its path,
    or by its name alone where the README names a kind of file that every run folder has."""
    missing = []
    for name, (loose, members) in records().items():
        names = {p.rsplit("/", 1)[-1] for p in set(loose) | members}
        for path in readme_cites(read(f"bench/records/{name}/README.md")):
            if not resolves(path, loose, members) and path.rsplit("/", 1)[-1] not in names:
                missing.append(f"{name}: {path}")
    assert missing == [], missing
    assert readme_cites("`run1/out.txt`, [plot](busbw.png), `bench/h200.py`, `$OUT/x.json`") == [
        "run1/out.txt", "busbw.png"]


def test_every_document_cites_records_that_hold_what_it_names():
    """bench/NOTES.md, bench/README.md, README.md and docs/ name records, and paths inside them,
    that are there: a loose file or folder, or a member or folder of the record's archive."""
    found, missing = records(), []
    for doc in ["bench/NOTES.md", "bench/README.md", "README.md", *glob.glob("docs/*.md", root_dir=ROOT)]:
        for m in RECORD_CITE.finditer(read(doc)):
            name, path = m.group(1), m.group(2)
            if name not in found or not resolves(path, *found[name]):
                missing.append(f"{doc}: {m.group(0)}")
    assert missing == [], missing
    cites = [m.group(0) for m in RECORD_CITE.finditer("records/2026-12-04-localhost-* and `bench/records/"
                                                      "2026-12-05-h200-status/second/`, records/2026-12-06-h200.")]
    assert cites == ["bench/records/2026-12-05-h200-status/second/", "records/2026-12-06-h200"], cites
