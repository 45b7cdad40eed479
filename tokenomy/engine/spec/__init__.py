"""Speculative decoding: proposals from the sequence's own tokens or the client's prediction, and from a draft model."""
