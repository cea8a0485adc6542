"""Speculative decoding: where drafts come from (the n-gram / prompt-lookup source, a draft
model), how long a request's drafts may be (adaptive per request), and how several sources
share a request.

Verification is not here: drafts ride in the next forward pass with the request's last token,
and the scheduler's TokenEmitter keeps only those the model's own samples confirm
(scheduler/token_emitter.py), whatever their source. So a source may guess anything; a good
guess saves forward passes, a bad one costs its rows' compute.
"""

from langrt.speculative.drafter import DraftCounts, DraftSource, Drafter, SpeculativeSource, make_speculative_sources
from langrt.speculative.draft_model import DraftModelDrafts
from langrt.speculative.ngram import NgramDrafts, RecentOutputs
from langrt.speculative.truncated import write_truncated_model

__all__ = [
    "DraftCounts",
    "DraftModelDrafts",
    "DraftSource",
    "Drafter",
    "NgramDrafts",
    "RecentOutputs",
    "SpeculativeSource",
    "make_speculative_sources",
    "write_truncated_model",
]
