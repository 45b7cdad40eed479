"""Structured output's offline side: the reference constrained greedy decoder that tests and bench/structured.py
measure compliance and TPOT with."""
