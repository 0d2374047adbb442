"""Sharded execution: one Mesh per engine, one logical-axis rules table (docs/sharding.md)."""
