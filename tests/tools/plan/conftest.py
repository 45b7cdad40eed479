"""The planner's tests read the packaged GGUF as the model tests do, with the same private summary cache."""

from tests.models.conftest import _private_cache, smollm2_gguf  # noqa: F401  (fixtures)
