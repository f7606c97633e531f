"""Load testing: workloads (long-tailed prompt/output lengths), the load generator, latency statistics (TTFT,
TPOT, ITL percentiles), and backends for any OpenAI-compatible endpoint or accel's runtime in-process.
`accel bench` and the optimize report's speed section run on it; quality evaluation is `accel.eval`.
"""
