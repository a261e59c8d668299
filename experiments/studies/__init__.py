"""Research studies that drive the model themselves — associative recall (`recall`), long-context
loss by position (`longctx`), needles in a haystack (`niah`) — and the benchmark tables
(`bench_layer`, `bench_step`). The studies share one skeleton (`study`); none imports another."""
