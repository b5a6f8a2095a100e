"""fuser's tools: what measures and shows, apart from what runs a model. ``import fuser`` does not load them.

bench + bench_report (the side-by-side benchmark and its tables and plot), targets (the open issues'
speed targets, scored from saved runs), calibrate (measures this GPU's cost-model constants), probes (its
microbenchmark kernels), tuning (``fuser.tune``), warm (``fuser.warmup``), timing (the interleaved timer
they share), workloads (named FFN shapes) and cli (``python -m fuser``). They use the package's runtime
and torch integration; nothing there uses them.
"""
