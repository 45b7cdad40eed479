"""What two runs of the same computation may differ by: kernel noise, which tests compare above, never inside.

- Greedy generation in different batches: llama.cpp picks other quantized matmul and attention kernels for other
  batch shapes (assert_same_up_to_noise).
- A router's probabilities: embeddings are float32, and the kernels that compute them and the BLAS calls that
  apply a head sum in an order that depends on the CPU (AVX2 or AVX-512, its cache sizes) and on the arrays'
  alignment, so the same prompt gives probabilities that differ in the last bits: 4e-9 between an AMD EPYC
  (Zen 4) and the Intel Xeon that wrote tests/router/data/router-v1-expected.json. PROBABILITY_NOISE is 250x
  that, and 4,000x below the smallest gap between a probability stored there and its threshold (4e-3): a
  comparison within it still catches a changed formula or a lost parameter, and no decision turns on it.
- Embeddings: the same text embedded alone or in a batch beside longer texts (padded and masked) gives vectors
  that differ by up to 1.5e-8 in a component with onnxruntime and 7e-8 with torch (all-MiniLM-L6-v2, unit length);
  EMBEDDING_NOISE is over 100x that and still 1,000x below what tells two different sentences apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

PROBABILITY_NOISE = 1e-6
EMBEDDING_NOISE = 1e-5


def assert_same_up_to_noise(a, b):
    """Identical tokens with logprobs equal up to kernel noise (llama.cpp picks different quantized matmul and
    attention kernels for different batch shapes: up to ~0.3 nat seen here with flash attention); a divergence
    only where the top two nearly tie."""
    for x, y in zip(a, b, strict=False):
        assert abs(x[1] - y[1]) < 0.4, (x, y)
        if x[0] != y[0]:
            assert min(x[2], y[2]) < 0.6, ("diverged without a near-tie", x, y)
            return


def assert_same_answer_up_to_noise(a, b, text_a: str, text_b: str) -> None:
    """Two greedy runs of one request, as (token, logprob, margin to the runner-up) per step with their texts: the
    same tokens and the same text, or the same until a step where the two part at a near-tie
    (assert_same_up_to_noise), one answer ending first only where the other's next step nearly tied (its end
    token the runner-up there)."""
    assert_same_up_to_noise(a, b)
    n = min(len(a), len(b))
    parted = next((i for i in range(n) if a[i][0] != b[i][0]), n)
    if parted < n:
        return
    if len(a) == len(b):
        assert text_a == text_b, (text_a, text_b)
    else:
        longer = a if len(a) > len(b) else b
        assert longer[n][2] < 0.6, ("one answer ended without a near-tie", a, b)


def assert_same_probabilities(got: Any, want: Any) -> None:
    """Router probabilities (arrays or floats) equal up to PROBABILITY_NOISE."""
    np.testing.assert_allclose(got, want, rtol=0, atol=PROBABILITY_NOISE)


def assert_same_vectors(got: Any, want: Any) -> None:
    """Embedding vectors (rows) equal component by component up to EMBEDDING_NOISE."""
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64), rtol=0,
                               atol=EMBEDDING_NOISE)


def shown(p: float, places: int = 4) -> Any:
    """What equals `p` as printed to `places` decimals (route signals, headers), computed on any CPU."""
    return pytest.approx(p, rel=0, abs=0.5 * 10 ** -places + PROBABILITY_NOISE)
