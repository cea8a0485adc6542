"""The light decoder (tokenizers only) decodes exactly like the transformers tokenizer."""

from __future__ import annotations

import sys

import pytest
import torch

from langrt.tokenizer.incremental_decoder import IncrementalDecoder
from langrt.tokenizer.text_decoder import load_text_decoder
from langrt.tokenizer.loader import load_tokenizer

TEXTS = [
    "The capital of France is Paris.",
    "def f(x):\n    return x ** 2  # squares",
    "Emoji 🙂🚀 and CJK 你好世界, accents é à ü.",
    "<|im_start|>user\nhello<|im_end|>\n",
    "  spaces   and\ttabs\n\nnewlines ",
    "12345 67890 3.14159",
]


@pytest.fixture(scope="module", params=["gguf", "hf_dir"])
def pair(request, smollm_path, tiny_llama_dir):
    path = smollm_path if request.param == "gguf" else tiny_llama_dir
    return load_tokenizer(path), load_text_decoder(path)


def test_decode_equals_transformers(pair):
    full, light = pair
    gen = torch.Generator().manual_seed(0)
    samples = [full.encode(t) for t in TEXTS] + [
        torch.randint(0, 49152, (40,), generator=gen).tolist() for _ in range(20)
    ]
    for ids in samples:
        for skip in (True, False):
            assert light.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
    assert light.eos_token_id == full.eos_token_id


def test_incremental_text_does_not_depend_on_push_sizes(pair):
    """The scheduler pushes one id at a time, the detokenizer whole batches: same text."""
    full, light = pair
    for text in TEXTS:
        ids = full.encode(text, add_special_tokens=False)
        prompt = full.encode("Say: ", add_special_tokens=False)
        one = IncrementalDecoder(light, prompt)
        for t in ids:
            one.push([t])
        one.flush()
        batched = IncrementalDecoder(light, prompt)
        batched.push(ids[: len(ids) // 2])
        batched.push(ids[len(ids) // 2 :])
        batched.flush()
        assert one.text == batched.text == full.decode(ids, skip_special_tokens=True)


def test_no_transformers_import():
    code = "import sys; from langrt.tokenizer.text_decoder import load_text_decoder; from langrt.builtin import builtin_model_path; load_text_decoder(builtin_model_path()); print('transformers' in sys.modules, 'torch' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr
