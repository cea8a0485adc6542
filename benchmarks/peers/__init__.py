"""Engines measured beside langrt, each in a process of its own (worker.py), so that start-up time
and resident memory are each engine's alone; host.py starts and drives them."""
