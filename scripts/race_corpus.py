"""The English corpus of the time-to-loss race, written by others and tokenised with GPT-2's BPE,
into a folder the GPU call carries (the GPU machine has no network):

    PYTHONPATH=build-cpu/pkg python3 scripts/race_corpus.py [--out .gpu/corpus]   # ~1.5 minutes

(xtrain importable: the documents are prepared with xtrain.data.prepare; tokenizers and, for the
check, tiktoken installed.)

What it does, on a machine that reaches Debian's and PyPI's registries:
- `apt-get download` the Debian packages of PACKAGES (documentation written in English by the
  Python, Perl and Vim projects: the reStructuredText sources of the Python 3.11 manuals, the
  Perl 5.36 POD manuals, Vim 9.0's help files; ~29 MB of prose with code examples) and extract
  their text files, one document each;
- `pip download` openai-whisper's source (MIT), which ships GPT-2's BPE ranks as
  whisper/assets/gpt2.tiktoken; the file's sha256 must be the one tiktoken records for r50k_base,
  GPT-2's ranks (tiktoken's own GPT-2 files come from a host this machine cannot reach);
- builds a Hugging Face tokenizer.json of GPT-2 from the ranks (gpt2_tokenizer_json: the
  byte-level vocabulary, the merges recovered from the ranks, GPT-2's pre-tokenizer, end-of-text
  50256), and checks that it encodes every document exactly as tiktoken does with the same ranks
  (where tiktoken is installed);
- prepares OUT/data with xtrain's prepare() (5% of the documents held out for validation, by
  their hash; the "hf" tokenizer kind, which the GPU machine loads with `tokenizers`);
- writes OUT/manifest.json (each package's name, version, licence and sha256, the tokenizer's
  source, the documents and tokens of each split) and the packages' copyright files.
The folder stays under 40 MB (checked). bench/time_to_loss.py --corpus OUT trains on OUT/data.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# (Debian package, the extracted files that are its documents, their licence as its copyright file says)
PACKAGES = (
    ("python3.11-doc", "usr/share/doc/python3.11/html/_sources/**/*.rst.txt",
     "PSF-2.0 (the Python documentation licence; usr/share/doc/python3.11-doc/copyright)"),
    ("perl-doc", "usr/share/perl/*/pod/*.pod", "GPL-1+ or Artistic (usr/share/doc/perl-doc/copyright)"),
    ("vim-runtime", "usr/share/vim/vim*/doc/*.txt",
     "Vim (usr/share/doc/vim-runtime/copyright, which also names OPL-1+ and BSD-3-clause files)"),
)
WHISPER = "openai-whisper==20250625"
RANKS_MEMBER = "whisper/assets/gpt2.tiktoken"
# tiktoken's expected sha256 of r50k_base.tiktoken: GPT-2's 50,256 BPE ranks.
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokenisation pattern (tiktoken's r50k_base; Hugging Face's ByteLevel uses the same).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
VAL_FRACTION = 0.05
MAX_BYTES = 40 << 20


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte value: the printable Latin-1 bytes stand for
    themselves, the other 68 take the code points from 256 up, in byte order."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def read_ranks(path: Path) -> dict[bytes, int]:
    """A .tiktoken file: one "base64(token) rank" per line."""
    import base64

    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def merge_of(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two tokens whose merge made `token`: byte-pair encoding of its bytes with the ranks below
    its own (the lowest-ranked adjacent pair merged first) ends in exactly two parts."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = min(((ranks.get(a + b, limit), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))))
        if best[0] >= limit:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {limit}) is not one merge of two lower-ranked tokens")
    return parts[0], parts[1]


def gpt2_tokenizer_json(ranks: dict[bytes, int], eot: str = EOT) -> str:
    """A Hugging Face tokenizer.json of the byte-level BPE with these ranks (ids = ranks), GPT-2's
    pre-tokenizer and decoder, and `eot` as the special token after the last rank."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if sorted(ranks.values()) != list(range(len(ranks))) or any(ranks.get(bytes([b])) is None for b in range(256)):
        raise ValueError("the ranks must number 0..n-1 and hold every single byte")
    symbols = byte_symbols()
    text = lambda token: "".join(symbols[b] for b in token)  # noqa: E731
    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [tuple(text(p) for p in merge_of(ranks, token))
              for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]) if len(token) > 1]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([eot])
    return tok.to_str()


def tiktoken_encoding(ranks: dict[bytes, int]):
    """tiktoken's encoder over the same ranks (GPT-2's pattern and end-of-text), or None when
    tiktoken is not installed."""
    try:
        import tiktoken
    except ImportError:
        return None
    return tiktoken.Encoding(name="gpt2-ranks", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})


def run(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"race_corpus: {' '.join(cmd)} failed:\n{done.stderr.strip()[-2000:]}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_documents(work: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    """The packages' records and their documents [(name, text)], in a fixed order."""
    records, documents = [], []
    for package, pattern, licence in PACKAGES:
        run(["apt-get", "download", package], work)
        deb = next(work.glob(f"{package}_*.deb"))
        root = work / package
        run(["dpkg-deb", "-x", str(deb), str(root)], work)
        version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        files = sorted(root.glob(pattern))
        if not files:
            raise SystemExit(f"race_corpus: {deb.name} holds no {pattern}")
        texts = [(f"{package}:{f.relative_to(root)}", f.read_text(encoding="utf-8", errors="replace")) for f in files]
        documents += [(name, text) for name, text in texts if text.strip()]
        records.append({"package": package, "version": version, "deb": deb.name, "sha256": sha256(deb),
                        "licence": licence, "documents": pattern, "files": len(files),
                        "bytes": sum(len(t.encode()) for _, t in texts),
                        "copyright": f"copyright/{package}"})
    return records, documents


def fetch_ranks(work: Path) -> tuple[dict, dict[bytes, int]]:
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(work), WHISPER], work)
    sdist = next(work.glob("openai_whisper-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(RANKS_MEMBER))
        data = tar.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != GPT2_RANKS_SHA256:
        raise SystemExit(f"race_corpus: {sdist.name}:{RANKS_MEMBER} is not GPT-2's ranks (sha256 differs)")
    path = work / "gpt2.tiktoken"
    path.write_bytes(data)
    record = {"source": WHISPER, "sdist": sdist.name, "sdist_sha256": sha256(sdist), "file": RANKS_MEMBER,
              "file_sha256": GPT2_RANKS_SHA256, "licence": "MIT (openai-whisper)"}
    return record, read_ranks(path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=".gpu/corpus", help="the folder to fill (replaced)")
    args = p.parse_args(argv)
    from xtrain.data import open_dataset, prepare

    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="race-corpus-") as tmp:
        work = Path(tmp)
        packages, documents = fetch_documents(work)
        tokenizer_record, ranks = fetch_ranks(work)
        (work / "tokenizer.json").write_text(gpt2_tokenizer_json(ranks))
        reference = tiktoken_encoding(ranks)
        if reference is not None:  # the Hugging Face tokenizer must be tiktoken's GPT-2, id for id
            from tokenizers import Tokenizer

            hf = Tokenizer.from_file(str(work / "tokenizer.json"))
            for name, text in documents:
                if hf.encode(text).ids != reference.encode_ordinary(text):
                    raise SystemExit(f"race_corpus: the tokenizer differs from tiktoken's on {name}")
            tokenizer_record["checked_against_tiktoken"] = f"every document, tiktoken {reference.name} of the same ranks"
        source = work / "documents.jsonl"
        with open(source, "w", encoding="utf-8") as f:
            for _, text in documents:
                f.write(json.dumps({"text": text}) + "\n")
        if out.exists():
            shutil.rmtree(out)
        (out / "copyright").mkdir(parents=True)
        for package, _, _ in PACKAGES:
            shutil.copy(work / package / "usr/share/doc" / package / "copyright", out / "copyright" / package)
        prepare(source, out / "data", tokenizer=work / "tokenizer.json", eot=EOT, val_fraction=VAL_FRACTION,
                seed=0, progress=False)
    ds = open_dataset(out / "data")
    splits = {s: len(ds.split(s).tokens) for s in ("train", "val")}
    manifest = {"what": "the time-to-loss race's English corpus (scripts/race_corpus.py)", "packages": packages,
                "tokenizer": tokenizer_record, "documents": len(documents), "val_fraction": VAL_FRACTION,
                "tokens": splits, "vocab_size": ds.vocab_size, "data": "data"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    if size > MAX_BYTES:
        raise SystemExit(f"race_corpus: {out} holds {size / 2**20:.1f} MiB, over {MAX_BYTES >> 20} MiB")
    print(f"race_corpus: {out}: {len(documents)} documents, {splits['train']:,} train and {splits['val']:,} "
          f"validation tokens, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
