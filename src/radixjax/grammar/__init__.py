"""Structured output: xgrammar-compiled grammars (JSON schema, regex, EBNF), per-request
matchers and the token bitmask the jitted step applies (see docs/structured_output.md)."""
