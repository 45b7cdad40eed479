"""The engine's fixed tuning constants, in one place: each one is a measured or reasoned choice that no
configuration needs to change (those that do are EngineConfig settings). The module that uses a constant reads it
from here as `tuning.NAME` at the point of use, so a bench or a test can try another value by setting it here.
Where a value came from a measurement, docs/engine.md has the numbers."""

from __future__ import annotations

# ---- the engine process (client.py, core.py) ------------------------------------------------------------------
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)   # waits before restarting a crashed engine process, one more
                                                    # step for each crash in a row (the last one repeats)
STABLE_S = 60.0             # an engine up this long has recovered: the next crash starts the backoff again
SELF_CHECK_TOKENS = 4       # greedy tokens the start-up self-check decodes on the real kernels
SCORE_TIMEOUT_S = 600.0     # the longest a "score" call (context compression's surprisal) may hold the engine thread

# ---- KV placement (layout_streams.py, kv_tier_io.py, prefix_cache.py, runner.py) ------------------------------
MIN_COPY_TOKENS = 8         # KV streams: a shared prefix shorter than this is recomputed rather than copied or
                            # restored (a stream copy costs 2-14 ms here, a prefilled token 4-6 ms)
COMPACT_MIN_LEFT = 8        # KV streams: a sequence with fewer tokens left to generate is not moved to close a gap
STATE_COPY_SHARE = 0.5      # KV streams: a stream holding at most this share of its cells is copied through the
                            # sequence state, cells in use only (cheaper up to about half)
STATE_COPY_MAX_BYTES = 256 << 20   # ... and a state no larger than this (the runner keeps a buffer that size)
FINGERPRINT_TOKENS = 128    # a prompt's identity for "seen before": its first tokens (past any shared template)
PIN_MAX_S = 3600.0          # the longest a finished sequence's KV may be pinned (SamplingParams.pin_s)
GHOSTS = 4096               # fingerprints of evicted prefixes remembered
SINK_TOKENS = 4             # context shift keeps these first tokens' KV (StreamingLLM's attention sinks)

# ---- KV tiers (kv_tier.py, kv_tier_io.py) ---------------------------------------------------------------------
MIN_TIER_TOKENS = 64        # shorter prefixes are not saved: they recompute in a fraction of a step
PRIOR_BYTES_PER_S = {"ram": 1e9, "disk": 2e8}   # a tier's restore speed until a restore from it is measured
BANDWIDTH_DECAY = 0.7       # weight of the past in a tier's measured restore speed (per restore)

# ---- speculative decoding (speculate.py, draft.py) ------------------------------------------------------------
NGRAM_MAX = 3               # prompt lookup: the longest suffix looked up
NGRAM_MIN = 1               # ... and the shortest
SEARCH_WINDOW = 4096        # prompt lookup: the most recent tokens searched for the suffix
MAX_DRAFT = 8               # tokens drafted per sequence and step, at most
PRIOR_ACCEPTANCE = 0.5      # a new sequence's acceptance rate before it has a record (and a prediction's agreement)
ACCEPTANCE_DECAY = 0.7      # weight of the past in a sequence's acceptance rate (per verified step) and in a
                            # prediction's agreement with the answer (per output token)
COST_DECAY = 0.9            # weight of the past in the measured time of a step of one size
CALIBRATE_CHUNK = 64        # draft model: prompt tokens in the calibration's catch-up step (larger are extrapolated)
CATCH_UP_HORIZON = 128      # draft model: output tokens its catch-up on a prompt is spread over, at most

# ---- sampling and text (sampling_params.py, vocab.py) ---------------------------------------------------------
GREEDY_BELOW = 1e-5         # temperatures below this sample the top token (dividing logits by 1e-45 gives inf)
PIECE_CACHE_CHARS = 1 << 22   # text of the pieces whose tokens are kept (about 1M tokens, 8 MB)
