"""/v1/embeddings and /encode over HTTP on a tiny random BERT: the OpenAI SDK's
client.embeddings.create (float and base64), usage counts, and 400s for bad input."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import torch

from tests.embedding_utils import SENTENCES, make_tiny_bert, transformers_embeddings
from tests.server_utils import LaunchedServer


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("tiny_bert_http"))


@pytest.fixture(scope="module")
def server(bert_dir):
    s = LaunchedServer(
        "--model-path", str(bert_dir), "--is-embedding", "--dtype", "float32", "--served-model-name", "tiny-bert"
    )
    yield s
    s.stop()


def test_openai_sdk_embeddings_create(server, bert_dir):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    reply = client.embeddings.create(model="tiny-bert", input=SENTENCES[:10])  # the SDK asks for base64
    floats = client.embeddings.create(model="tiny-bert", input=SENTENCES[:10], encoding_format="float")
    ours = np.array([d.embedding for d in reply.data])
    assert np.allclose(ours, [d.embedding for d in floats.data], atol=1e-6)
    cos = torch.nn.functional.cosine_similarity(torch.tensor(ours, dtype=torch.float32),
                                                transformers_embeddings(bert_dir, SENTENCES[:10]), dim=-1)  # fmt: skip
    assert cos.min() >= 0.999
    assert [d.index for d in reply.data] == list(range(10)) and reply.model == "tiny-bert"
    expected_tokens = sum(len(s.split()) + 2 for s in SENTENCES[:10])
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == expected_tokens


def test_base64_is_little_endian_float32(server):
    _, floats = server.post("/v1/embeddings", {"input": "the cat", "encoding_format": "float"})
    _, b64 = server.post("/v1/embeddings", {"input": "the cat", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, np.float32(floats["data"][0]["embedding"]))


def test_native_encode(server):
    _, one = server.post("/encode", {"text": "the cat sat"})
    _, many = server.post("/encode", {"text": ["the cat sat", "a dog ran"], "dimensions": 8})
    assert len(one["embedding"]) == 64 and one["meta_info"]["prompt_tokens"] == 5
    assert len(many) == 2 and len(many[1]["embedding"]) == 8
    assert np.isclose(np.linalg.norm(many[0]["embedding"]), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "body, param",
    [({"input": []}, "input"), ({"input": ""}, "input"), ({"input": " ".join(["cat"] * 80)}, "input"),
     ({"input": [[1, 2], 3]}, "input"), ({"input": "cat", "dimensions": 1000}, "dimensions"),
     ({"input": "cat", "encoding_format": "int8"}, "encoding_format"), ({"model": "x"}, "input")],
)  # fmt: skip
def test_bad_input_is_400(server, body, param):
    status, reply = server.post("/v1/embeddings", body, check=False)
    assert status == 400 and reply["error"]["param"] == param, reply


def test_generation_is_refused(server):
    status, reply = server.post("/generate", {"text": "the cat", "sampling_params": {"max_new_tokens": 2}}, check=False)
    assert status == 400 and "embeddings" in reply["error"]["message"]


def test_generation_server_refuses_embeddings(tiny_llama_dir):
    server = LaunchedServer("--model-path", str(tiny_llama_dir), "--max-total-tokens", "2048", "--dtype", "float32")
    try:
        status, reply = server.post("/v1/embeddings", {"input": "hello"}, check=False)
    finally:
        server.stop()
    assert status == 400 and "--is-embedding" in reply["error"]["message"]
