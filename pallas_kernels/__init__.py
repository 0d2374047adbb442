"""Pallas kernels (ragged paged attention, KV write), each beside a pure-jnp reference."""
