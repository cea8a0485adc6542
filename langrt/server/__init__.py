"""The main process's side of a request: tokenize, validate, send to the scheduler, gather the
results (`tokenizer_manager`, `req_state`), the grammar check before sending (`grammar_check`),
and the counters `/metrics` reports (`metrics`).
"""
