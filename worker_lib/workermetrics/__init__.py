"""The leader's load input: CPU providers, per-lease throughput, the reporter and the WorkerMetricStats store
(docs/kcl-compatibility.md, "Worker-metrics table"; docs/worker.md)."""
