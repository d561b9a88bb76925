"""Tokenizers brought by the user: a Hugging Face tokenizer.json and a SentencePiece model, built
here (no downloads). The end-of-text rule, fingerprints, saving and loading, bad files, and the
round trip prepare -> train -> checkpoint -> sample -> export -> transformers.AutoTokenizer."""

import json
import shutil

import numpy as np
import pytest

from tokhelp import (cli_run, hf_tokenizer, one_error_line, spm_model, word_level_tokenizer,
                     write_corpus)
from xtrain.trainer import cli
from xtrain.io import state
from xtrain.data import (DataError, HFTokenizer, SentencePieceTokenizer, load_tokenizer,
                         open_dataset, open_tokenizer, prepare)

TEXT = "Once upon a time Lily and Max played in the park."


@pytest.fixture(scope="module")
def hf_file(tmp_path_factory):
    return hf_tokenizer(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory):
    return spm_model(tmp_path_factory.mktemp("spm"))


# ---------------------------------------------------------------- the end-of-text rule

def test_hf_tokenizer_encodes_without_the_post_processor(hf_file):
    tok = open_tokenizer(hf_file)
    assert isinstance(tok, HFTokenizer) and tok.kind == "hf" and tok.name == f"hf-{tok.vocab_size}"
    ids = tok.encode(TEXT)
    assert ids[0] != 1, "the post-processor's <s> must not be added"
    assert tok.decode(ids) == TEXT
    assert tok.encode_batch([TEXT, "max"]) == [ids, tok.encode("max")]
    # No tokenizer_config.json: the first candidate in the vocabulary, </s>.
    assert tok.eot_id == 2 and tok.eot_text == "</s>"


def test_eot_rule_for_a_tokenizer_json(hf_file, tmp_path):
    assert open_tokenizer(hf_file, eot="<s>").eot_id == 1  # named
    local = tmp_path / "dir"
    shutil.copytree(hf_file.parent, local)
    # A tokenizer_config.json beside the file names it (an AddedToken dict, as older files do).
    (local / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<s>"}}))
    assert open_tokenizer(local).eot_id == 1
    assert open_tokenizer(local / "tokenizer.json", eot="</s>").eot_id == 2  # the flag wins
    (local / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(DataError, match="names eos_token '<\\|im_end\\|>', which is not in the vocabulary"):
        open_tokenizer(local)
    with pytest.raises(DataError, match="'<nope>' is not in the vocabulary"):
        open_tokenizer(hf_file, eot="<nope>")
    # Nothing names one and no well-known token is there: say how to name it.
    words = word_level_tokenizer(tmp_path / "words" / "tokenizer.json", 10)
    with pytest.raises(DataError, match="cannot tell which token .* ends a document.*--eot TOKEN"):
        open_tokenizer(words)
    assert open_tokenizer(words, eot="w3").eot_id == 3
    # The end of text is part of what the ids mean.
    assert open_tokenizer(words, eot="w3").fingerprint != open_tokenizer(words, eot="w4").fingerprint


def test_eot_rule_for_sentencepiece(spm_file, tmp_path):
    tok = open_tokenizer(spm_file)
    assert isinstance(tok, SentencePieceTokenizer) and tok.kind == "sentencepiece"
    assert tok.eot_id == 2 and tok.eot_text == "</s>"  # the model's eos piece
    assert open_tokenizer(spm_file, eot="<unk>").eot_id == 0
    with pytest.raises(DataError, match="not in the vocabulary"):
        open_tokenizer(spm_file, eot="</nope>")  # an unknown piece maps to unk: not accepted
    no_eos = spm_model(tmp_path, "noeos.model", eos_id=-1, user_defined_symbols=[])
    with pytest.raises(DataError, match="cannot tell which token.*--eot"):
        open_tokenizer(no_eos)
    candidates = spm_model(tmp_path, "eot.model", eos_id=-1, user_defined_symbols=["<|endoftext|>"])
    eot_tok = open_tokenizer(candidates)
    assert eot_tok.eot_text == "<|endoftext|>"


def test_bad_tokenizer_files_are_one_clear_error(hf_file, tmp_path, capsys):
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text(hf_file.read_text()[:500])
    with pytest.raises(DataError, match="corrupt.json: not a valid tokenizer.json"):
        open_tokenizer(corrupt)
    (tmp_path / "other.json").write_text('{"model": 3}')
    with pytest.raises(DataError, match="not a valid tokenizer.json"):
        open_tokenizer(tmp_path / "other.json")
    (tmp_path / "bad.model").write_bytes(b"\x00\x01 not a protobuf" * 10)
    with pytest.raises(DataError, match="bad.model: not a SentencePiece model"):
        open_tokenizer(tmp_path / "bad.model")
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(DataError, match="expected a Hugging Face tokenizer .json or a SentencePiece"):
        open_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no tokenizer.json"):
        open_tokenizer(tmp_path / "empty")
    (tmp_path / "corpus.txt").write_text("One document.\n\nAnother one.\n")
    for tokenizer, needle in ((corrupt, "not a valid tokenizer.json"), (tmp_path / "missing.json", "no such file"),
                              (tmp_path / "bad.model", "not a SentencePiece model")):
        code, err = cli_run(capsys, "prepare", tmp_path / "corpus.txt", "--out", tmp_path / "out",
                         "--tokenizer", tokenizer, "--no-progress")
        one_error_line(code, err, needle)
    code, err = cli_run(capsys, "prepare", tmp_path / "corpus.txt", "--out", tmp_path / "out", "--eot", "</s>")
    one_error_line(code, err, "eot applies to a tokenizer file")
    assert not (tmp_path / "out" / "meta.json").exists()


def test_saved_tokenizers_load_back_alike(hf_file, spm_file, tmp_path):
    for source in (hf_file, spm_file):
        tok = open_tokenizer(source)
        saved = tmp_path / tok.kind
        main = tok.save(saved)
        assert main.name == tok.files[0] and sorted(p.name for p in saved.iterdir()) == sorted(tok.files)
        for kind in (None, tok.kind):  # found from the files, or as recorded
            back = load_tokenizer(saved, kind)
            assert (type(back), back.fingerprint, back.eot_id, back.vocab_size) == \
                (type(tok), tok.fingerprint, tok.eot_id, tok.vocab_size)
            assert back.encode(TEXT) == tok.encode(TEXT)
        # Ids a larger (rounded-up) model vocabulary may produce decode to nothing.
        assert back.decode([*tok.encode("max"), tok.vocab_size, 10**6]) == back.decode(tok.encode("max"))
        config = json.loads((saved / "tokenizer_config.json").read_text())
        assert config["eos_token"] == tok.eot_text
        (saved / "tokenizer_config.json").unlink()
        with pytest.raises(DataError, match="missing tokenizer_config.json"):
            load_tokenizer(saved, tok.kind)
    # A saved tokenizer.json, re-serialised compactly, keeps its fingerprint.
    spec = json.loads(hf_file.read_text())
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(spec, separators=(",", ":")))
    assert open_tokenizer(compact).fingerprint == open_tokenizer(hf_file).fingerprint


# ---------------------------------------------------------------- prepare -> train -> export

@pytest.mark.parametrize("kind", ["hf", "sentencepiece"])
def test_round_trip_to_transformers(kind, hf_file, spm_file, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    if kind == "sentencepiece" and not hasattr(transformers, "SentencePieceBackend"):
        pytest.skip("the export's SentencePieceBackend class needs transformers >= 5")
    source = hf_file if kind == "hf" else spm_file
    corpus = write_corpus(tmp_path / "corpus.txt")
    data, run = tmp_path / "data", tmp_path / "run"
    code, err = cli_run(capsys, "prepare", corpus, "--out", data, "--tokenizer", source, "--val-fraction", "0.1",
                     "--no-progress")
    assert code == 0, err
    tok = open_tokenizer(source)
    ds = open_dataset(data)
    assert ds.tokenizer.fingerprint == tok.fingerprint and ds.meta["request"]["tokenizer"] == f"{kind}:{tok.fingerprint}"
    assert sorted(p.name for p in data.iterdir()) == sorted({"meta.json", "train.bin", "val.bin", *tok.files})
    # Every document was tokenized by the given tokenizer, preceded by its end of text.
    train = np.asarray(ds.split("train").tokens)
    assert train[0] == tok.eot_id
    first = train[1:int(np.flatnonzero(train[1:] == tok.eot_id)[0]) + 1]
    assert list(first) == tok.encode(tok.decode(list(first)))
    # Reused as it is; another tokenizer on the same directory is refused.
    assert prepare(corpus, data, tokenizer=source, val_fraction=0.1, progress=False) == data
    with pytest.raises(DataError, match="other settings"):
        prepare(corpus, data, tokenizer=source, eot="<unk>", val_fraction=0.1, progress=False)

    code, err = cli_run(capsys, "train", "--data", data, "--out", run, "--preset", "tiny", "--steps", "2",
                     "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens", "4",
                     "--no-progress", "--device", "cpu")
    assert code == 0, err
    ckpt = state.load(run / "ckpt")
    assert ckpt.tokenizer_meta["kind"] == kind and ckpt.tokenizer_meta["file"] == tok.files[0]
    assert set(tok.files) <= set(ckpt.meta["files"])
    assert ckpt.tokenizer().fingerprint == tok.fingerprint
    code = cli.main(["sample", "--ckpt", str(run / "ckpt"), "--prompt", "Once upon", "--max-new-tokens", "4",
                     "--greedy"])
    printed = capsys.readouterr().out
    assert code == 0 and printed.startswith("Once upon") and len(printed.strip()) > len("Once upon")
    code, err = cli_run(capsys, "export", "--ckpt", run / "ckpt", "--out", tmp_path / "hf", "--dtype", "f32")
    assert code == 0, err
    exported = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert exported["eos_token"] == tok.eot_text and exported["model_max_length"] == ckpt.config.max_seq
    assert (tmp_path / "hf" / tok.files[0]).read_bytes() == source.read_bytes()

    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in (TEXT, "max jumped, lily ran all day", "Ünïcode  and   spaces"):
        assert auto(text, add_special_tokens=False)["input_ids"] == tok.encode(text), (kind, text)
    assert auto.eos_token_id == tok.eot_id
    ids = tok.encode(TEXT)
    assert auto.decode(ids) == tok.decode(ids)


def test_sample_continues_the_prompt_with_its_spaces(spm_file):
    from xtrain.trainer.train import sample_text

    tok = open_tokenizer(spm_file)

    class Echo:  # generates the ids of " max" after any prompt
        def generate(self, ids, n, **kw):
            return np.array([ids[0] + tok.encode(" max jumped")])

    assert sample_text(Echo(), tok, "Once upon", 2) == "Once upon max jumped"
