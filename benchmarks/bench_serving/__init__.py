"""The parts of benchmarks/serving.py: workloads (what to send), client (one streamed
request over HTTP), runner (when to send: rate / concurrency / bounds), metrics (what
the records add up to), report (table, JSON, PNG plots)."""
