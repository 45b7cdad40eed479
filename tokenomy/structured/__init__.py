"""Structured output: OpenAI response_format and tools -> llguidance grammars -> per-sequence token masks.

schema.py turns request fields into an OutputFormat (one grammar); tools.py turns tool-call text back into
``tool_calls`` (whole or as stream deltas);
grammar.py compiles and caches grammars with a time bound; constraint.py is what the engine's sampler calls
each step; validate.py checks finished answers with ``jsonschema``; tokenizer.py builds the llguidance
tokenizer from a llama.cpp vocabulary.
"""

from tokenomy.structured.constraint import Constraint, ConstraintError, NoRoom, start_constraint
from tokenomy.structured.grammar import CompiledGrammar, GrammarCompiler
from tokenomy.structured.schema import OutputFormat, SchemaError, json_schema_format, output_format
from tokenomy.structured.tools import ToolCallStream, parse_tool_calls, tools_prompt
from tokenomy.structured.validate import Validation, check_schema, validate, validate_output, validate_tool_calls

__all__ = [
    "CompiledGrammar",
    "Constraint",
    "ConstraintError",
    "GrammarCompiler",
    "NoRoom",
    "OutputFormat",
    "SchemaError",
    "ToolCallStream",
    "Validation",
    "check_schema",
    "json_schema_format",
    "output_format",
    "parse_tool_calls",
    "start_constraint",
    "tools_prompt",
    "validate",
    "validate_output",
    "validate_tool_calls",
]
