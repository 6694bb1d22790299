"""Subword vocabularies (issue 54): the space's ``tokenizer:`` field, the byte-level BPE (nested, deterministic,
every input representable), the corpus tokenized and cached, and a tokenizer.json refused in one line."""

import json

import numpy as np
import pytest

from search_spaces import SPACES_DIR, Subnet, SubnetError, UserError, load_space, parse_space
from search_spaces.space import SpaceError, TokenizerSpec
from supernet.data import prepare_corpus
from supernet.tokenizer import (Vocabulary, byte_tokenizer_json, check_vocabulary, read_vocabulary, tokenize_corpus,
                                tokenizer_json, train_merges, train_vocabulary)

TINY = (SPACES_DIR / "tiny.yaml").read_text()


def tiny_with(line: str) -> str:
    return TINY.replace("vocab_size: 256          # byte-level", line)


def corpus_docs(n: int = 40) -> list[bytes]:
    """Python-like documents, deterministic, with repeated words so that pairs recur."""
    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz_", dtype=np.uint8)
    words = [bytes(rng.choice(letters, size=int(rng.integers(2, 10)))) for _ in range(400)]
    weights = 1.0 / np.arange(1, len(words) + 1)  # Zipf: some pairs far more frequent than others
    docs = []
    for i in range(n):
        lines = [b" ".join(words[j] for j in rng.choice(len(words), size=8, p=weights / weights.sum())) + b"(x)\n"
                 for _ in range(30)]
        docs.append(b"".join(lines) + f"# doc {i} \u00e9t\u00e9\n".encode())
    return docs


# --------------------------------------------------------------------------- the space format


def test_byte_spaces_keep_their_hash_and_format():
    """``tokenizer: bytes`` is the default: a space without the field, or with it, is the byte space it was."""
    tiny = load_space("tiny")
    assert tiny.tokenizer == TokenizerSpec() and tiny.vocabs == (256,)
    assert "tokenizer" not in tiny.to_dict()
    same = parse_space(TINY.replace("vocab_size: 256          # byte-level", "vocab_size: 256\ntokenizer: bytes"), "t.yaml")
    assert same.hash == tiny.hash
    assert tiny.largest().vocab is None and "vocab" not in tiny.largest().to_dict()


def test_a_bpe_space_and_its_vocabulary_gene():
    one = parse_space(tiny_with("tokenizer: {bpe: 1024}"), "one.yaml")
    assert one.vocab_size == 1024 and one.vocabs == (1024,) and not one.tokenizer.searched
    assert one.sample(np.random.default_rng(0)).vocab is None  # one vocabulary: no gene
    searched = parse_space(tiny_with("tokenizer: {bpe: [4096, bytes, 1024]}"), "s.yaml")
    assert searched.vocabs == (256, 1024, 4096) and searched.vocab_size == 4096
    assert searched.tokenizer.to_dict() == {"bpe": ["bytes", 1024, 4096]}
    assert searched.hash != one.hash != load_space("tiny").hash
    assert searched.largest().vocab == 4096 and searched.smallest().vocab == 256
    rng = np.random.default_rng(1)
    drawn = {searched.sample(rng).vocab for _ in range(60)}
    assert drawn == {256, 1024, 4096}
    s = searched.sample(np.random.default_rng(2))
    assert searched.decode(searched.encode(s)) == s and searched.feature_names()[-1] == "vocab"
    assert Subnet.from_dict(s.to_dict()) == s and "vocab" in s.to_dict()
    assert searched.genes(s)["vocab"] == (s.vocab, (256, 1024, 4096))
    child = searched.mutate(s, np.random.default_rng(3), 1.0)
    assert child in searched
    assert searched.size() == 3 * load_space("tiny").size()
    assert "tokenizer     byte-level BPE bytes, 1,024, 4,096   (searched)" in searched_describe(searched)


def searched_describe(space) -> str:
    from search_spaces import describe

    return describe(space)


def test_membership_of_the_vocabulary():
    searched = parse_space(tiny_with("tokenizer: {bpe: [bytes, 1024]}"), "s.yaml")
    bad = Subnet(64, 1, (1,), (128,), ("softmax",), vocab=512)
    with pytest.raises(SubnetError, match=r"vocab: 512 is not one of 256, 1024"):
        searched.check(bad)
    with pytest.raises(SubnetError, match=r"vocab: 1024 given, but space 'tiny' does not search the vocabulary"):
        load_space("tiny").check(Subnet(64, 1, (1,), (128,), ("softmax",), vocab=1024))


@pytest.mark.parametrize("line, message", [
    ("tokenizer: {bpe: 100}", "t.yaml: tokenizer.bpe: 100 is not a vocabulary size: expected bytes or an integer in "
                              "257..65536 (the 256 ids of the bytes come first)"),
    ("tokenizer: words", "t.yaml: tokenizer: 'words' is not a tokenizer (expected bytes, {bpe: 4096} or "
                         "{bpe: [bytes, 1024, 4096]})"),
    ("tokenizer: {bpe: [512, 512]}", "t.yaml: tokenizer.bpe: repeated choice(s) 512"),
    ("tokenizer: {bpe: []}", "t.yaml: tokenizer.bpe: expected a size or a non-empty list of sizes"),
    ("vocab_size: 256\ntokenizer: {bpe: 1024}", "t.yaml: vocab_size: 256 is smaller than the largest vocabulary of "
                                                "tokenizer.bpe (1024)"),
])
def test_a_bad_tokenizer_field_is_one_line(line, message):
    with pytest.raises(SpaceError) as e:
        parse_space(tiny_with(line), "t.yaml")
    assert len(e.value.errors) == 1 and e.value.errors[0].startswith(message), e.value.errors


def test_a_byte_only_task_refuses_a_subword_vocabulary():
    text = (SPACES_DIR / "encoder-tiny.yaml").read_text()
    text = text.replace("vocab_size: 256", "tokenizer: {bpe: 1024}", 1)
    with pytest.raises(SpaceError, match="tokenizer: task masked-lm reads bytes only"):
        parse_space(text, "e.yaml")


# --------------------------------------------------------------------------- the vocabulary


def test_bpe_vocabularies_are_nested_and_deterministic():
    """The first k merges of a BPE trained to the largest size are what ``tokenizers`` trains to size k."""
    docs = corpus_docs()
    largest = train_vocabulary(docs, TokenizerSpec("bpe", (256, 300, 400), 256))
    assert largest.size == 400 and largest.kind == "bpe"
    for k in (300, 350):
        trained = Vocabulary(tokenizer_json(train_merges(docs, k, 256)))
        assert largest.at(k).text == trained.text
        assert largest.at(k).size == k
    assert train_vocabulary(docs, TokenizerSpec("bpe", (400,), 256)).text == largest.text  # deterministic
    assert largest.at(256).text == byte_tokenizer_json()


def test_ids_and_round_trip_of_any_bytes():
    vocab = train_vocabulary(corpus_docs(), TokenizerSpec("bpe", (400,), 256))
    data = b"def value(self):\n  return None\xff\xfe\x00 \xc3 caf\xc3\xa9 \xf0\x9f\x98\x80"
    ids = vocab.encode(data)
    assert vocab.decode(ids) == data and len(ids) < len(data) and int(ids.max()) < 400
    assert vocab.at(256).encode(data).tolist() == list(data)  # no merge: the ids are the bytes
    lengths = vocab.token_lengths()
    assert int(lengths[ids].sum()) == len(data)  # the bytes a loss is divided by
    assert (lengths[:256] == 1).all() and (lengths[256:] >= 2).all()


def test_specials_sit_after_the_bytes_and_spell_nothing():
    docs = corpus_docs()
    vocab = Vocabulary(tokenizer_json(train_merges(docs, 300, 259), 259, ("bos", "eos", "pad")))
    assert vocab.specials == ("bos", "eos", "pad") and vocab.base == 259 and vocab.size == 300
    assert vocab.token_lengths()[256:259].tolist() == [0, 0, 0]
    assert vocab.decode([104, 256, 105]) == b"hi"
    assert 256 not in vocab.encode(b"<bos> bos \xe2\x9f\xa8bos\xe2\x9f\xa9").tolist()  # text never makes a special


def test_the_corpus_is_tokenized_once_and_cached(tmp_path):
    data = tmp_path / "docs"
    data.mkdir()
    for i, d in enumerate(corpus_docs(30)):
        (data / f"d{i}.py").write_bytes(d)
    corpus = prepare_corpus(str(data), tmp_path / "cache", seed=0, val_fraction=0.2)
    spec = TokenizerSpec("bpe", (256, 320), 256)
    said = []
    tok = tokenize_corpus(corpus, spec, tmp_path / "cache", progress=said.append)
    assert said and tok.train.sizes == (256, 320)
    assert np.array_equal(np.asarray(tok.train.at(256)), np.asarray(corpus.train))  # the byte vocabulary is the bytes
    assert len(tok.train.at(320)) < len(corpus.train)
    assert tok.vocabulary.decode(tok.val.at(320)) == bytes(np.asarray(corpus.val))
    bpt = tok.bytes_per_token()
    assert bpt[256] == 1.0 and bpt[320] == pytest.approx(len(corpus.val) / len(tok.val.at(320)), rel=1e-5)
    again = []
    tok2 = tokenize_corpus(corpus, spec, tmp_path / "cache", progress=again.append)
    assert again == [] and tok2.vocabulary.sha256 == tok.vocabulary.sha256  # the cache: nothing trained again


# --------------------------------------------------------------------------- a tokenizer.json given


def test_a_tokenizer_json_that_is_not_one_is_one_line(tmp_path):
    vocab = train_vocabulary(corpus_docs(), TokenizerSpec("bpe", (400,), 256))
    path = tmp_path / "tokenizer.json"
    cases = {
        "{": "not a tokenizer.json (not JSON",
        json.dumps({"model": {"type": "WordPiece"}}): "not a tokenizer.json of a BPE",
        vocab.text.replace('"!":33', '"!":1033'): "not a byte-level BPE whose ids 0-255 are the bytes",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(UserError) as e:
            read_vocabulary(path)
        assert str(e.value).startswith(f"{path}: {message}") and "\n" not in str(e.value)
    path.write_text(vocab.text)
    with pytest.raises(UserError, match=r"a vocabulary of 400 ids, larger than the model's embedding \(300 rows\)$"):
        read_vocabulary(path, embedding=300)
    assert read_vocabulary(path, embedding=400).sha256 == vocab.sha256
    assert check_vocabulary(byte_tokenizer_json(), "b").kind == "bytes"
