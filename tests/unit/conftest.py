"""The grammar tests' common fixtures over the built-in model's tokenizer. Module scope: a
grammar learns its models' spellings (jump-forward), so each module starts from fresh ones."""

from __future__ import annotations

import pytest

from langrt.constrained import GrammarCompiler
from langrt.constrained.vocab import vocabulary_from_decoder
from langrt.tokenizer.loader import load_tokenizer
from langrt.tokenizer.text_decoder import load_text_decoder


@pytest.fixture(scope="module")
def tokenizer(smollm_path):
    return load_tokenizer(smollm_path)


@pytest.fixture(scope="module")
def vocab(smollm_path):
    return vocabulary_from_decoder(load_text_decoder(smollm_path), 49152, {2})


@pytest.fixture(scope="module")
def compiler(vocab):
    return GrammarCompiler(vocab)
