"""The grammar engines behind `--grammar-backend`, one module each, and their interface.

- `base.py`: what a backend is (`GrammarBackend`, the matchers it makes: `GrammarMatcherLike`),
  and the factory that picks one and puts it behind the compile service (constrained/service.py).
- `langrt_backend.py`: langrt's own engine (constrained/grammar.py and below), its automata built
  in a worker process that is killed at the time limit.
- `xgrammar_backend.py`, `llguidance_backend.py`: those packages, adapted; `dialects.py` writes
  langrt's EBNF and choices in their grammar dialects.
"""
