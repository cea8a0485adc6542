"""A tiny random-weight BERT with a WordPiece tokenizer and sentence-transformers settings (mean
pooling + normalize), saved as a model directory, and a transformers reference for it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ("the a cat dog sat on mat ran fast slow red blue green house tree sky sun moon day night "
         "is was and or of to in big small happy sad old new car road river").split()  # fmt: skip
SENTENCES = [
    " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 9)) for i in range(100)
]  # 100 sentences of 3..11 words, many distinct


def make_tiny_bert(path: Path, seed: int = 0) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64)  # fmt: skip
    model = BertModel(config, add_pooling_layer=False).eval()
    model.save_pretrained(path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "2_Normalize").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return path


@torch.inference_mode()
def transformers_embeddings(path: Path, sentences: list[str]) -> torch.Tensor:
    """Mean pooling over real tokens + normalize, with transformers' BertModel: [N, hidden]."""
    from transformers import AutoTokenizer, BertModel

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = BertModel.from_pretrained(path, add_pooling_layer=False).eval()
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
