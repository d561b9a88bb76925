"""The docs stay honest about their evidence: every result file that README.md and docs/*.md cite
exists in bench/results/, every file in bench/results/ is cited somewhere (the folder keeps the
files the docs rest on, nothing else; older ones are in git history), and the project's own files
cite no file outside the repository (DESIGN.md, GPU.md).

How the docs cite a result file (each form is resolved here):
- its name in backticks, bare or with its folder: `ops-dim768-20261201-153754.json`,
  `bench/results/flash_tune-20261201-230417.json`, or a `bench/results/NAME` path in the text;
- several files in one span, '/' between them: `scaling-20261130-014551/-014613.json` (the
  extension of the last applies to all), `data_run-...-113024.json/.png` (a second extension),
  `generate-dim768-staged1/0-20261202-1025*.json` (alternatives before a shared tail);
- a shortened name right after a full one, its trailing '-' segments replaced:
  `profile-dim768-b128-20261202-010838.json`, `-010854.json`; a '…' stands for the segments
  left out (`…-20261201-134729.json`, `…-b128-…-212329.json`);
- a '*' is a wildcard and must match at least one file.
"""
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
EXTENSIONS = (".json", ".png", ".log")
DATE = re.compile(r"(?:^|-)20\d{6}(?:-|$)")
# a backticked span, a bench/results/ path in the text, or a full file name in the text, in order
CITATION = re.compile(r"`([^`\n]+)`|(bench/results/[\w.*…/-]+\w)"
                      r"|\b([a-z][\w]*(?:-\w+)*-20\d{6}-[\w-]*\w\.(?:json|png|log))\b")
SHORT = re.compile(r"^[-…][\w.*…-]*\d{6}[\w.*…-]*$")
FILE_CHARS = re.compile(r"^[\w.*…/-]+$")


def _docs() -> list:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def _split_ext(name: str) -> tuple:
    for ext in EXTENSIONS:
        if name.endswith(ext):
            return name[: -len(ext)], ext
    return name, ""


def _expand_short(short: str, previous: str) -> str:
    """A shortened name completed from the file cited before it: its '-' segments replace the
    previous name's last ones, a '…' segment keeps the previous name's segment there."""
    stem, ext = _split_ext(short)
    prev_stem, prev_ext = _split_ext(previous)
    parts = stem.lstrip("…-").split("-")
    prev = prev_stem.split("-")
    if len(parts) > len(prev):
        return f"{short} (after {previous})"
    head = prev[: len(prev) - len(parts)]
    tail = [prev[len(head) + i] if p == "…" else p for i, p in enumerate(parts)]
    return "-".join(head + tail) + (ext or prev_ext)


def _names_in_span(span: str, previous: str) -> list:
    """The file names (or patterns) one cited span stands for; [] if it cites no result file."""
    span = span.strip().removeprefix("bench/results/")
    if not FILE_CHARS.match(span):
        return []
    pieces = span.split("/")
    first, last = pieces[0], pieces[-1]
    if first.startswith(("-", "…")):
        if not SHORT.match(first):
            return []
        if not previous:
            return ["*" + first.lstrip("…").replace("…", "*")]
        first = _expand_short(first, previous)
    elif not DATE.search(first):
        if len(pieces) == 1 or not DATE.search(last):
            return []
        # alternatives before a shared tail: `NAME-a/b-DATE-TIME.ext`
        cut = last.index("-")
        tail = last[cut:]
        alternatives = pieces[1:-1] + [last[:cut]]
        return [first + tail] + [first[: len(first) - len(a)] + a + tail for a in alternatives]
    last_ext = _split_ext(last)[1]
    names = [first]
    for piece in pieces[1:]:
        names.append(_split_ext(first)[0] + piece if piece.startswith(".")
                     else _expand_short(piece, first))
    return [n if _split_ext(n)[1] else n + last_ext for n in names]


def cited_names(text: str) -> list:
    """Every result file name a doc cites, in order (shortened names completed)."""
    names, previous = [], ""
    for match in CITATION.finditer(text):
        span = next(group for group in match.groups() if group)
        for name in _names_in_span(span, previous):
            names.append(name)
            previous = name
    return names


def _matches(name: str, files: list) -> list:
    if "*" in name or "…" in name:
        return fnmatch.filter(files, name.replace("…", "*"))
    if name in files:
        return [name]
    if not _split_ext(name)[1]:  # cited without its extension
        return [f for f in files if _split_ext(f)[0] == name]
    return []


def test_cited_result_files_exist_and_every_result_file_is_cited():
    files = sorted(p.name for p in RESULTS.iterdir() if p.is_file())
    missing, cited = [], set()
    for doc in _docs():
        for name in cited_names(doc.read_text()):
            found = _matches(name, files)
            if not found:
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
            cited.update(found)
    assert not missing, "cited but not in bench/results/:\n" + "\n".join(missing)
    uncited = sorted(set(files) - cited)
    assert not uncited, ("in bench/results/ but cited by no doc (cite it or git rm it):\n"
                         + "\n".join(uncited))


def test_citation_forms_resolve():
    text = ("`profile-dim768-b128-20261202-010838.json`, `-010854.json`; "
            "`scaling-20261130-014551/-014613.json`; `data_run-x-20261201-113024.json/.png`; "
            "`train_throughput-dim768-b32-s256-bf16-20261202-040522.json` `…-20261201-134729.json` "
            "`profile-dim768-b32-20261201-195115.json` → `…-b128-…-212329.json`; "
            "`generate-dim768-staged1/0-20261202-1025*.json`; bench/results/ops-a-20261129-final.json; "
            "in the text recompute-20261130-010221.json.")
    assert cited_names(text) == [
        "profile-dim768-b128-20261202-010838.json", "profile-dim768-b128-20261202-010854.json",
        "scaling-20261130-014551.json", "scaling-20261130-014613.json",
        "data_run-x-20261201-113024.json", "data_run-x-20261201-113024.png",
        "train_throughput-dim768-b32-s256-bf16-20261202-040522.json",
        "train_throughput-dim768-b32-s256-bf16-20261201-134729.json",
        "profile-dim768-b32-20261201-195115.json", "profile-dim768-b128-20261201-212329.json",
        "generate-dim768-staged1-20261202-1025*.json", "generate-dim768-staged0-20261202-1025*.json",
        "ops-a-20261129-final.json", "recompute-20261130-010221.json"]
    assert cited_names("`-010854.json`") == ["*-010854.json"]
    assert cited_names("`state.json`, `data_run-PRESET-DATE.json/.png`, `bench/results/`") == []


OUTSIDE_FILES = re.compile(r"\b(?:DESIGN|GPU)(?:\.md\b| invariant)")


def test_no_file_cites_documents_outside_the_repository():
    """No source, script or document of the project names a file outside the repository."""
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    for folder in ("bench", "python", "csrc", "scripts", "tests"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.name != "test_docs.py"
                        and p.suffix in (".py", ".pyi", ".sh", ".md", ".cpp", ".cu", ".cuh", ".h"))
    offenders = []
    for path in files:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if OUTSIDE_FILES.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "cites a file outside the repository:\n" + "\n".join(offenders)
