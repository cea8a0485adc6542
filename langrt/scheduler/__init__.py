"""The scheduler process: the loop that batches requests and drives the model (`scheduler`),
admission (`prefill_adder`), ordering (`schedule_policy`), request state (`req`), what each
forward pass emits (`token_emitter`, `constraints`, `logprob_collector`), and the process around
it (`scheduler_process`).
"""
