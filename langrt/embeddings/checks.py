"""Which loop serves a model under --is-embedding, decided once at start-up."""

from __future__ import annotations

from langrt.errors import ModelLoadError
from langrt.model.registry import native_arch
from langrt.model.source import ModelSource
from langrt.server_args import ServerArgs


def serves_encoder(args: ServerArgs) -> bool:
    """True for an encoder model (BERT family) served with --is-embedding; an encoder without
    the flag cannot generate, so it stops the start-up with what to do."""
    source = ModelSource.resolve(args.model_path)
    if source.is_gguf:
        return False
    arch = native_arch(source.hf_config())
    if arch is None or not arch.encoder:
        return False
    if not args.is_embedding:
        raise ModelLoadError(f"{arch.hf_class} is an encoder model: it serves embeddings only; add --is-embedding")
    return True
